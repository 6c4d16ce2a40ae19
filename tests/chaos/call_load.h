#pragma once
// CallLoad: a steady load of idempotent and non-idempotent calls through a pool, each call's
// outcome recorded.

#include <cstdint>
#include <string>
#include <vector>

#include <kj/async.h>
#include <kj/time.h>

#include "troupe/base/errors.h"
#include "troupe/base/event_loop.h"
#include "troupe/base/random.h"
#include "troupe/pool/actor_pool.h"
#include "chaos.capnp.h"

namespace troupe::chaos {

enum class CallKind : uint8_t {
  IDEMPOTENT,   // idempotentOp, sent with CallOptions::idempotent
  RECORD_ONCE,  // recordOnce, not idempotent: it must never run twice
};

// "idempotentOp", "recordOnce".
const char* toString(CallKind kind);

// One call and how it ended.
struct CallRecord {
  uint64_t id = 0;  // the callId it carried, unique in the run
  CallKind kind = CallKind::IDEMPOTENT;
  kj::TimePoint start = kj::origin<kj::TimePoint>();
  kj::Duration took = 0 * kj::SECONDS;  // until its promise settled (or the hang limit)
  bool hung = false;                    // not settled by deadline + hangLimit: given up on
  kj::Maybe<ErrorCode> error;           // null when it succeeded
  std::string message;                  // the error's description
};

struct CallLoadOptions {
  // Calls in flight at once: each lane sends its next call when its last one settled.
  // Default 8.
  uint32_t lanes = 8;

  // Each call's deadline (CallOptions::deadline). Default 3 s.
  kj::Duration deadline = 3 * kj::SECONDS;

  // How long past its deadline a call may stay unsettled before it counts as hung and is
  // dropped, so that a hang fails the test instead of stalling it. Default 10 s.
  kj::Duration hangLimit = 10 * kj::SECONDS;
};

// Sends calls through `pool` (borrowed), half of them idempotent, chosen with `random`. Loop
// thread only; must outlive the promise run() returns.
class CallLoad {
public:
  CallLoad(EventLoop& loop, ActorPool<Chaos>& pool, Random& random, CallLoadOptions options = {});
  KJ_DISALLOW_COPY(CallLoad);

  // Keeps options.lanes calls in flight until `until` on the loop's clock, then resolves once
  // every call it started has settled (or hung). Call once.
  kj::Promise<void> run(kj::TimePoint until);

  // Every call that ended, in the order they did.
  const std::vector<CallRecord>& records() const { return records_; }

  const CallLoadOptions& options() const { return options_; }

private:
  kj::Promise<void> lane(kj::TimePoint until);
  kj::Promise<CallRecord> call(uint64_t id, CallKind kind);

  EventLoop& loop;
  ActorPool<Chaos>& pool;
  Random& random;
  const CallLoadOptions options_;
  uint64_t nextId = 1;
  std::vector<CallRecord> records_;
};

}  // namespace troupe::chaos
