#pragma once
// Backoff: how long to wait before trying again something that failed, for every retry loop in
// troupe (a pool's failover, the registry client's reconnects).

#include <cstdint>

#include <kj/time.h>

#include "troupe/base/random.h"

namespace troupe {

// Exponential waits with jitter: the wait before retry number `attempt` (0 for the first) is
// `initial` doubled `attempt` times, capped at `max`, then scaled by a random factor between
// one half and one, so that many clients failing at once do not retry in step. A plain value.
class Backoff {
public:
  // Requires 0 < initial <= max; `what` names them in the error (the options they came from).
  Backoff(kj::Duration initial, kj::Duration max,
          kj::StringPtr what = "a backoff's initial and max");

  kj::Duration delay(uint32_t attempt, Random& random) const;

  // The wait before jitter: `initial` doubled `attempt` times, capped at `max`.
  kj::Duration ceiling(uint32_t attempt) const;

private:
  kj::Duration initial;
  kj::Duration max;
};

}  // namespace troupe
