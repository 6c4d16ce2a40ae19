#include "troupe/base/parse_number.h"

#include <kj/exception.h>

namespace troupe {

kj::Maybe<uint64_t> parseWholeNumber(kj::ArrayPtr<const char> text, uint64_t max) {
  if (text.size() == 0) return nullptr;
  for (char c : text) {
    if (c < '0' || c > '9') return nullptr;
  }
  uint64_t value = 0;
  auto copy = kj::heapString(text);
  if (kj::runCatchingExceptions([&]() { value = copy.parseAs<uint64_t>(); }) != nullptr) {
    return nullptr;  // too large for 64 bits
  }
  if (value > max) return nullptr;
  return value;
}

}  // namespace troupe
