#include "resolver/resolver.h"

#include "actor/errors.h"

namespace troupe {

void validatePrefix(kj::StringPtr prefix) {
  if (prefix.size() > MAX_PREFIX_LENGTH) {
    throwError(
        ErrorCode::INVALID_ARGUMENT,
        kj::str("prefix is ", prefix.size(), " bytes long (the limit is ", MAX_PREFIX_LENGTH, ")"));
  }
  for (size_t i = 0; i < prefix.size(); ++i) {
    unsigned char c = prefix[i];
    if (c < 0x21 || c > 0x7e) {
      kj::StringPtr what = c == ' '                ? " (a space)"_kj
                           : c < 0x20 || c == 0x7f ? " (a control character)"_kj
                                                   : " (not ASCII)"_kj;
      throwError(ErrorCode::INVALID_ARGUMENT,
                 kj::str("prefix has byte ", c < 0x10 ? "0x0" : "0x", kj::hex(c), what,
                         " at offset ", i, "; prefixes are printable ASCII without spaces"));
    }
  }
}

}  // namespace troupe
