#include "troupe/base/backoff.h"

#include <kj/debug.h>

#include "troupe/base/errors.h"

namespace troupe {

Backoff::Backoff(kj::Duration initial, kj::Duration max, kj::StringPtr what)
    : initial(initial), max(max) {
  if (!(initial > 0 * kj::NANOSECONDS && initial <= max)) {
    throwError(ErrorCode::INVALID_ARGUMENT,
               kj::str(what, " need 0 < initial <= max; got ", initial, " and ", max));
  }
}

kj::Duration Backoff::ceiling(uint32_t attempt) const {
  auto wait = initial;
  for (uint32_t i = 0; i < attempt && wait < max; ++i) wait = wait * 2;
  return wait < max ? wait : max;
}

kj::Duration Backoff::delay(uint32_t attempt, Random& random) const {
  int64_t nanos = ceiling(attempt) / kj::NANOSECONDS;
  return static_cast<int64_t>(static_cast<double>(nanos) * random.uniform(0.5, 1.0)) *
         kj::NANOSECONDS;
}

}  // namespace troupe
