#pragma once
// ActorPool<T>: calls into an ActorGroup, one member at a time with failover, or all at once.
//
//   troupe::ActorPool<ParameterServer> pool(group);
//   auto w = pool.call([](auto ps) { return ps.pullRequest().send(); }).wait(ws);
//   auto all = pool.broadcast([](auto ps) { ... }).waitAll(5 * kj::SECONDS).wait(ws);

#include <map>
#include <string>
#include <type_traits>

#include <kj/async.h>

#include "troupe/actor/actor_ref.h"
#include "troupe/pool/actor_group.h"
#include "troupe/pool/broadcast.h"

namespace troupe {

enum class Balancing : uint8_t {
  ROUND_ROBIN,        // each call to the next READY member, in name order
  LEAST_OUTSTANDING,  // to the READY member with the fewest calls in flight from this pool
};

struct ActorPoolOptions {
  // How call() picks a member. Default ROUND_ROBIN.
  Balancing balancing = Balancing::ROUND_ROBIN;

  // Deadline for calls whose CallOptions name none; it bounds every attempt and backoff of
  // the call together. Default 60 s.
  kj::Duration defaultDeadline = 60 * kj::SECONDS;

  // Most attempts one call() makes (the first included). Default 5.
  uint32_t maxAttempts = 5;

  // Backoff between attempts when no other member is left to try: exponential from
  // `initialBackoff`, capped at `maxBackoff`, each wait drawn at random between half and the
  // whole of it. Defaults 10 ms and 1 s.
  kj::Duration initialBackoff = 10 * kj::MILLISECONDS;
  kj::Duration maxBackoff = 1 * kj::SECONDS;
};

class ActorPoolBase;

namespace detail {

// What the deadline needs to know of a call, shared with it.
struct CallProgress final : public kj::Refcounted {
  bool attempted = false;  // an attempt reached (or tried to reach) a member
};

// Counts one attempt in flight to `member` for LEAST_OUTSTANDING, until dropped (whether the
// attempt finished, failed or was cancelled).
class Outstanding {
public:
  Outstanding(ActorPoolBase& pool, std::string member);
  ~Outstanding() noexcept(false);
  KJ_DISALLOW_COPY(Outstanding);

private:
  ActorPoolBase& pool;
  std::string member;
};

// The retry decisions of one call(), independent of T. Loop thread only.
class PoolCall {
public:
  PoolCall(ActorPoolBase& pool, const CallOptions& options);
  KJ_DISALLOW_COPY(PoolCall);

  // The member for the next attempt; null when no member is READY.
  kj::Maybe<GroupMember&> pick();

  // After attempt `member` failed with `e`: resolves when the call should be tried again, or
  // rejects with the error the caller gets (see ActorPool::call).
  kj::Promise<void> afterFailure(kj::Exception&& e, const Endpoint& member);

  // No member was READY: resolves when the group changed (rejects with JOB_ENDED when the job
  // has ended). Waiting for a member does not count against maxAttempts; the deadline bounds it.
  kj::Promise<void> afterNoMember();

  kj::Duration deadline() const { return deadline_; }
  kj::Own<CallProgress> progress() { return kj::addRef(*progress_); }

private:
  kj::Promise<void> retryLater(kj::Exception&& e, bool immediately);

  ActorPoolBase& pool;
  kj::Own<CallProgress> progress_;
  bool idempotent;
  kj::Duration deadline_;
  uint32_t attempts = 0;
  std::map<std::string, uint32_t> failedOn;  // members this call failed on
};

}  // namespace detail

// The untyped part of ActorPool<T>. Borrows the group, which must outlive it; the pool must in
// turn outlive the promises its calls return.
class ActorPoolBase {
public:
  explicit ActorPoolBase(ActorGroupBase& group, ActorPoolOptions options = {});
  KJ_DISALLOW_COPY(ActorPoolBase);

  // The group the pool draws members from.
  ActorGroupBase& group() { return group_; }
  const ActorPoolOptions& options() const { return options_; }

  // Calls in flight from this pool to `member` (by name).
  uint32_t outstanding(const std::string& member) const;

protected:
  // The error a call gets when its deadline passes: NO_ENDPOINTS when no member was ever ready
  // for it (it never ran), else DEADLINE_EXCEEDED.
  kj::Exception deadlineError(kj::Duration deadline, const detail::CallProgress& progress);

private:
  friend class detail::PoolCall;
  friend class detail::Outstanding;

  ActorGroupBase& group_;
  ActorPoolOptions options_;
  size_t nextIndex = 0;
  std::map<std::string, uint32_t> outstanding_;
};

// A pool over the members of an ActorGroup<T>. Belongs to the group's loop.
template <typename T>
class ActorPool : public ActorPoolBase {
public:
  explicit ActorPool(ActorGroup<T>& group, ActorPoolOptions options = {})
      : ActorPoolBase(group, kj::mv(options)) {}

  // Runs `fn(client)` against one READY member (see Balancing) and resolves with its response.
  // When the attempt fails in a way that guarantees the call never reached the actor
  // (callNeverRan(): the member was unreachable, draining, no longer hosting the actor, or no
  // member was ready) the call is sent again, to another member when there is one, else after
  // a backoff. When it fails after it may have reached the actor (DISCONNECTED, OVERLOADED), it
  // is sent again only if `options.idempotent`; otherwise it rejects with MAY_HAVE_RUN, which
  // names the member and the original error. An exception the actor raised (raisedByActor(),
  // whatever its type) is never retried. While no member is READY the call waits for one.
  // Everything happens within the call's deadline (options.deadline, else the pool's default),
  // after which it rejects with DEADLINE_EXCEEDED, or NO_ENDPOINTS if no member was ever ready
  // for it; and within options().maxAttempts attempts. Dropping the promise cancels the call.
  template <typename Fn>
  auto call(Fn&& fn, CallOptions options = {}) -> kj::Promise<typename detail::PromiseValue<
      std::decay_t<std::invoke_result_t<Fn&, typename T::Client>>>::Type> {
    using Value = typename detail::PromiseValue<
        std::decay_t<std::invoke_result_t<Fn&, typename T::Client>>>::Type;
    auto state = kj::heap<detail::PoolCall>(*this, options);
    auto deadline = state->deadline();
    auto& loop = group().loop();
    auto expired = loop.timer().afterDelay(deadline).then(
        [this, deadline, progress = state->progress()]() -> kj::Promise<Value> {
          return deadlineError(deadline, *progress);
        });
    return attempt<Value>(kj::mv(state), kj::fwd<Fn>(fn), options.idempotent)
        .exclusiveJoin(kj::mv(expired));
  }

  // Runs `fn(client)` against every READY member at once. The returned future gives a result
  // per member (BroadcastFuture::waitAll / waitAny / waitQuorum / next). Broadcast calls are
  // not retried.
  template <typename Fn>
  auto broadcast(Fn&& fn, CallOptions options = {}) -> BroadcastFuture<typename detail::PromiseValue<
      std::decay_t<std::invoke_result_t<Fn&, typename T::Client>>>::Type> {
    using Value = typename detail::PromiseValue<
        std::decay_t<std::invoke_result_t<Fn&, typename T::Client>>>::Type;
    auto members = group().readyMembers();
    auto endpoints = KJ_MAP(m, members) { return m->endpoint; };
    auto state = kj::refcounted<detail::BroadcastState<Value>>(group().loop(), kj::mv(endpoints));
    for (size_t i = 0; i < members.size(); ++i) {
      auto ref = ActorRef<T>(members[i]->ref);
      auto& s = *state;
      s.calls.add(ref.call(fn, options)
                      .then([&s, i](Value&& v) { s.succeeded(i, kj::mv(v)); },
                            [&s, i](kj::Exception&& e) { s.failed(i, kj::mv(e)); })
                      .eagerlyEvaluate(nullptr));
    }
    return BroadcastFuture<Value>(kj::mv(state));
  }

private:
  template <typename Value, typename Fn>
  kj::Promise<Value> attempt(kj::Own<detail::PoolCall> state, Fn fn, bool idempotent) {
    KJ_IF_MAYBE(member, state->pick()) {
      auto endpoint = member->endpoint;
      auto ref = ActorRef<T>(member->ref);
      auto promise = ref.call(fn, CallOptions{.idempotent = idempotent})
                         .attach(kj::heap<detail::Outstanding>(*this, endpoint.name));
      return promise.then(
          [](Value&& v) -> kj::Promise<Value> { return kj::mv(v); },
          [this, state = kj::mv(state), fn = kj::mv(fn), idempotent,
           endpoint = kj::mv(endpoint)](kj::Exception&& e) mutable -> kj::Promise<Value> {
            auto& s = *state;
            return s.afterFailure(kj::mv(e), endpoint)
                .then([this, state = kj::mv(state), fn = kj::mv(fn), idempotent]() mutable {
                  return attempt<Value>(kj::mv(state), kj::mv(fn), idempotent);
                });
          });
    }
    auto& s = *state;
    return s.afterNoMember().then([this, state = kj::mv(state), fn = kj::mv(fn),
                                   idempotent]() mutable {
      return attempt<Value>(kj::mv(state), kj::mv(fn), idempotent);
    });
  }
};

}  // namespace troupe
