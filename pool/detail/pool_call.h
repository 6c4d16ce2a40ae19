#pragma once
// One ActorPool call, as a small state machine. ActorPool::call (actor_pool.h) states the rules;
// this applies them.
//
//   PICKING     a READY member by the pool's balancing, preferring members this call has not
//               failed on and that are not ejected; while none is READY, waits for the group
//   ATTEMPTING  sends on that member; the attempt ends in one of the AttemptEnds below
//   BACKING_OFF after a FAILED_OVER attempt when no member is left untried, then PICKING again
//   DONE        with the response or the error, and the member of the last attempt
//
// The call's deadline bounds all of them: when it passes, the call is DONE with
// DEADLINE_EXCEEDED, or NO_ENDPOINTS if no attempt was ever made.

#include <map>
#include <string>

#include <kj/async.h>
#include <kj/function.h>

#include "troupe/pool/actor_pool.h"
#include "troupe/pool/detail/pool_core.h"

namespace troupe::pool_detail {

// How one attempt ended; each decides what the call does next.
enum class AttemptEnd : uint8_t {
  ANSWERED,      // the member answered: DONE with its response
  ACTOR_RAISED,  // the actor raised an error: DONE with it; never retried
  FAILED_OVER,   // it never reached the actor, or it may have but the call is idempotent: the
                 // call tries again, on another member at once if one is left untried, else
                 // after a backoff; DONE once maxAttempts were made
  MAY_HAVE_RUN,  // it may have reached the actor and the call is not idempotent: DONE with
                 // MAY_HAVE_RUN, naming the member and the error
  FAILED,        // an error no retry mends (INVALID_ARGUMENT, UNIMPLEMENTED, ...): DONE with it
};

// One attempt's end, naming its member (held by its PoolCall).
struct Attempted {
  AttemptEnd end;
  const GroupMember& member;
  kj::Maybe<kj::Own<AnyResponse>> response;  // when ANSWERED
  kj::Maybe<kj::Exception> error;            // otherwise
};

// What the end of an attempt that failed with `e` is (AttemptEnd), for a call that is
// `idempotent` or not.
AttemptEnd judge(const kj::Exception& e, bool idempotent);

// Loop thread only.
class PoolCall {
public:
  using Result = CallResult<kj::Own<AnyResponse>>;

  // Runs a call of `attempt` through `pool` until it is DONE; never rejects. Its result names
  // the member of the last attempt when `nameMember`.
  static kj::Promise<Result> run(ActorPoolBase::Impl& pool, const CallOptions& options,
                                 ActorPoolBase::Attempt attempt, bool nameMember);

  PoolCall(ActorPoolBase::Impl& pool, const CallOptions& options, ActorPoolBase::Attempt attempt,
           bool nameMember);
  KJ_DISALLOW_COPY(PoolCall);

private:
  kj::Promise<Result> picking();
  // `counted`: the member's counters (counting()).
  kj::Promise<Attempted> attempting(const GroupMember& member,
                                    kj::Maybe<PoolCounters::Member&> counted);
  kj::Promise<Result> ended(Attempted&& attempted);
  Result done(kj::Maybe<kj::Own<AnyResponse>> response, kj::Maybe<kj::Exception> error);
  Result expired();

  // The member for the next attempt; null when no member is READY.
  kj::Maybe<kj::Own<const GroupMember>> pick();
  // The next of the `n` READY members (by the pool's balancing) that is `eligible`; null if none.
  kj::Maybe<kj::Own<const GroupMember>> choose(
      size_t n, kj::FunctionParam<bool(const GroupMember&)> eligible);
  bool tried(const GroupMember& m) const { return failedOn.count(m.endpoint.name) > 0; }
  // Whether a READY member is left that this call has not failed on.
  bool anyUntried() const;
  // Counts an attempt on `member` about to start (before `last` is set to it); returns the
  // member's counters, null when the pool counts nothing.
  kj::Maybe<PoolCounters::Member&> counting(const GroupMember& member);

  ActorPoolBase::Impl& pool;
  ActorPoolBase::Attempt attempt;
  const bool idempotent;
  const bool nameMember;
  const kj::Duration deadline;
  const kj::TimePoint start;
  uint32_t attempts = 0;
  kj::Own<const GroupMember> last;  // the member of the latest attempt; null before the first
  std::map<std::string, uint32_t> failedOn;  // members this call failed on
};

}  // namespace troupe::pool_detail
