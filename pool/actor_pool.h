#pragma once
// ActorPool<T>: calls into an ActorGroup, one member at a time with failover, or all at once.
//
//   troupe::ActorPool<ParameterServer> pool(group);
//   auto w = pool.call([](auto ps) { return ps.pullRequest().send(); }).wait(ws);
//   auto all = pool.broadcast([](auto ps) { ... }).waitAll(5 * kj::SECONDS).wait(ws);

#include <type_traits>

#include <capnp/capability.h>
#include <kj/async.h>
#include <kj/function.h>

#include "troupe/actor/actor_ref.h"
#include "troupe/actor/blob.h"
#include "troupe/pool/actor_group.h"
#include "troupe/pool/broadcast.h"
#include "troupe/pool/call_result.h"

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

  // Backoff between attempts when no other member is left to try (see Backoff): exponential
  // from `initialBackoff`, capped at `maxBackoff`, each wait drawn at random between half and
  // the whole of it from the loop's random source. Defaults 10 ms and 1 s.
  kj::Duration initialBackoff = 10 * kj::MILLISECONDS;
  kj::Duration maxBackoff = 1 * kj::SECONDS;

  // Bound on each attempt of an idempotent call: an attempt its member has not answered within
  // it is given up (cancelled there, counted as the member's failure) and the call goes to
  // another member. Zero: no bound per attempt (the call's deadline and the probe below still
  // apply). Default 0.
  kj::Duration attemptTimeout = 0 * kj::SECONDS;

  // Liveness probe. Once an attempt has waited `probeAfter` for its member, the pool pings the
  // member's server (ActorHost.ping, answered by the server's loop without entering the actor)
  // and again every `probeAfter` while the attempt waits; one ping per member at a time, shared
  // by every call waiting there. A ping unanswered within `probeTimeout` marks the member
  // unresponsive (frozen, or its loop blocked): it is ejected (below), and the idempotent calls
  // waiting on it go to other members at once, while calls that are not idempotent keep waiting
  // (they must not run twice; their deadline bounds them). So a member whose actor blocks its
  // server's loop for longer than probeAfter + probeTimeout counts as unresponsive: raise both
  // for such actors. A ping that is late while the member's connection moves a large message
  // (a big request or response, either way, which the ping waits behind) is not unanswered:
  // the member is busy, not stuck. Zero `probeAfter`: no probes. Defaults 1 s and 1 s.
  kj::Duration probeAfter = 1 * kj::SECONDS;
  kj::Duration probeTimeout = 1 * kj::SECONDS;

  // Outlier ejection, as in Envoy and brpc. A member that did not answer a probe, or whose
  // attempts failed `ejectAfterFailures` times in a row (unreachable, disconnected, overloaded
  // or given up; never an error its actor raised), gets no new calls from this pool for an
  // ejection period: `ejectionTime`, doubled for each ejection in a row, at most
  // `maxEjectionTime`. After the period it is pinged, and only an answer brings it back. While
  // every READY member is ejected the pool uses them all anyway. Zero `ejectAfterFailures`:
  // failures never eject (unanswered probes still do). Defaults 3, 1 s and 30 s.
  uint32_t ejectAfterFailures = 3;
  kj::Duration ejectionTime = 1 * kj::SECONDS;
  kj::Duration maxEjectionTime = 30 * kj::SECONDS;

  // Whether calls are counted and timed (metrics()). Default true; false leaves the series at
  // zero and saves their clock reads (bench/README.md measures the difference).
  bool metrics = true;
};

// How a call's fate is decided. Three clocks watch a call, each for its own failure. The call's
// deadline (CallOptions::deadline, else defaultDeadline) is the caller's: it bounds every attempt,
// backoff and wait for a member together, and when it passes the call ends with
// DEADLINE_EXCEEDED (it may have run) or NO_ENDPOINTS (it was never sent), whatever is in flight.
// The connection's epoch (Channel::epoch) is the transport's: an attempt is sent on one
// connection, and when that connection breaks its attempts fail with DISCONNECTED; the failure
// drops that connection only if it is still the member's current one (not one a newer attempt
// has already replaced), so the next attempt connects again. Liveness probes are the member's:
// a connection can stay up while the process behind it is frozen, so an attempt unanswered for
// probeAfter has its member pinged, and an unanswered ping ejects the member and ends the
// idempotent attempts waiting on it. Of these outcomes only those that prove the call never
// reached the actor, or a call marked idempotent, are tried again; an attempt that may have run
// ends a non-idempotent call with MAY_HAVE_RUN, and an error the actor raised ends any call.
// pool/detail/pool_call.h holds that state machine.
//
// The untyped part of ActorPool<T>: its calls take the member's capability as a
// capnp::Capability::Client (cast it, e.g. to a capnp::DynamicCapability for a program without
// generated code). Belongs to its group's loop. Borrows the group, which must outlive the pool.
//
// The pool owns its calls: destroying it cancels those still in flight (their promises reject
// with FAILED, "the pool was destroyed before the call finished; it may have run"; broadcast
// members not yet answered get that error as their result). drain() lets them finish first.
class ActorPoolBase {
public:
  explicit ActorPoolBase(ActorGroupBase& group, ActorPoolOptions options = {});
  ~ActorPoolBase() noexcept(false);
  KJ_DISALLOW_COPY(ActorPoolBase);

  // The group the pool draws members from.
  ActorGroupBase& group();
  const ActorPoolOptions& options() const;

  // Calls in flight from this pool to `member` (by name).
  uint32_t outstanding(kj::StringPtr member) const;

  // Whether `member` (by name) is ejected from this pool now (see ActorPoolOptions).
  bool ejected(kj::StringPtr member) const;

  // Calls and broadcasts of this pool that have not finished.
  size_t callsInFlight() const;

  // This pool's metrics now (metrics.h), labelled with its group's job and actor: calls by
  // outcome and their latency as the caller sees it, retries, failovers, calls given up as
  // MAY_HAVE_RUN, broadcasts and their members' outcomes, and per member the attempts sent,
  // those that failed and their latency. Also in its loop's metrics (EventLoop::metrics()).
  MetricsSnapshot metrics() const;

  // ActorPool<T>::call and callResult with the member's untyped capability.
  template <typename Fn>
  auto callCapability(Fn&& fn, CallOptions options = {})
      -> kj::Promise<CallValue<Fn, capnp::Capability::Client>>;
  template <typename Fn>
  auto callCapabilityResult(Fn&& fn, CallOptions options = {})
      -> kj::Promise<CallResult<CallValue<Fn, capnp::Capability::Client>>>;

  // ActorPool<T>::broadcast with each member's untyped capability.
  template <typename Fn>
  auto broadcastCapability(Fn&& fn, CallOptions options = {})
      -> BroadcastFuture<CallValue<Fn, capnp::Capability::Client>>;

  // Sends `bytes` as blob `name` at `version` to every READY member's server (blob.h: the
  // members accept it with ActorServer::acceptBlobs), laid out as options.fanout says over the
  // members in name order, so that with CHAIN or TREE each member forwards to the next. The
  // result holds one BlobResult per member, in name order; a member that dies or refuses is
  // routed around. The connections are the transfer's own, made with options.channel (default:
  // the loop's credentials). Throws INVALID_ARGUMENT for a bad name or options and NO_ENDPOINTS
  // when no member is READY. The bytes must not change until the transfer ends; the transfer is
  // not one of the pool's calls (drain() does not wait for it).
  BlobTransfer broadcastBlob(kj::StringPtr name, uint64_t version, kj::Array<const kj::byte> bytes,
                             BlobSendOptions options = {});

  // Refuses new calls and broadcasts (they reject with DRAINING: they never ran) and resolves
  // once every call and broadcast member call in flight has finished. Calling it again joins
  // the same drain. Destroying the pool first rejects it with the pool's FAILED error.
  kj::Promise<void> drain();

  struct Impl;  // in actor_pool.cpp

  // One attempt of a call (or one member's call of a broadcast) on a member's capability, with
  // its response's type erased (call_result.h), so that what surrounds it compiles once. What
  // the call function throws while building its request it throws on, so that the pool knows
  // the request was never sent (ActorRefBase::start).
  using Attempt = kj::Function<kj::Promise<kj::Own<AnyResponse>>(capnp::Capability::Client)>;

private:
  template <typename V, typename Fn>
  static Attempt erase(Fn&& fn);

  // The call: its attempts until it is done or its deadline passes (pool/detail/pool_call.h).
  // Never rejects: its result holds the error, and, when `nameMember`, the member of the last
  // attempt (a copy of its Endpoint, which call() has no use for).
  kj::Promise<CallResult<kj::Own<AnyResponse>>> callWith(Attempt attempt,
                                                         const CallOptions& options,
                                                         bool nameMember);
  // `attempt` on every READY member at once.
  BroadcastFutureBase broadcastWith(Attempt attempt, const CallOptions& options);

  kj::Own<Impl> impl;
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
  // for it; and within options().maxAttempts attempts. An idempotent attempt on a member that
  // does not answer (past options().attemptTimeout, or unanswered probes) is given up and the
  // call goes elsewhere; members that fail repeatedly are skipped for a while (outlier
  // ejection, see ActorPoolOptions). Dropping the promise cancels the call;
  // so does destroying the pool (see ActorPoolBase).
  template <typename Fn>
  auto call(Fn&& fn, CallOptions options = {}) -> kj::Promise<CallValue<Fn, typename T::Client>> {
    return callCapability(typedFn(kj::fwd<Fn>(fn)), options);
  }

  // call(), resolved with a CallResult instead: the response or the error the call got, and the
  // member of its last attempt (the one whose answer or error it holds; an empty endpoint when
  // no attempt was made, as when no member was ready). Never rejects.
  template <typename Fn>
  auto callResult(Fn&& fn, CallOptions options = {})
      -> kj::Promise<CallResult<CallValue<Fn, typename T::Client>>> {
    return callCapabilityResult(typedFn(kj::fwd<Fn>(fn)), options);
  }

  // Runs `fn(client)` against every READY member at once. The returned future gives a result
  // per member (BroadcastFuture::waitAll / waitAny / waitQuorum / next); a member's error names
  // the member and its address. Broadcast calls are not retried.
  template <typename Fn>
  auto broadcast(Fn&& fn, CallOptions options = {})
      -> BroadcastFuture<CallValue<Fn, typename T::Client>> {
    return broadcastCapability(typedFn(kj::fwd<Fn>(fn)), options);
  }

private:
  // `fn`, taking the member's untyped capability.
  template <typename Fn>
  static auto typedFn(Fn&& fn) {
    return
        [fn = kj::fwd<Fn>(fn)](capnp::Capability::Client c) mutable { return fn(c.castAs<T>()); };
  }
};

// ---------------------------------------------------------------------------------------------

template <typename V, typename Fn>
ActorPoolBase::Attempt ActorPoolBase::erase(Fn&& fn) {
  return [fn = kj::fwd<Fn>(fn)](capnp::Capability::Client c) mutable {
    // What `fn` throws is thrown on: ActorRefBase::start() tells a request too large to build.
    kj::Promise<V> sent = fn(kj::mv(c));
    return sent.then([](V&& value) { return wrapResponse(kj::mv(value)); });
  };
}

template <typename Fn>
auto ActorPoolBase::callCapability(Fn&& fn, CallOptions options)
    -> kj::Promise<CallValue<Fn, capnp::Capability::Client>> {
  using Value = CallValue<Fn, capnp::Capability::Client>;
  return callWith(erase<Value>(kj::fwd<Fn>(fn)), options, false)
      .then([](CallResult<kj::Own<AnyResponse>>&& result) {
        return unwrapResult<Value>(kj::mv(result)).take();
      });
}

template <typename Fn>
auto ActorPoolBase::callCapabilityResult(Fn&& fn, CallOptions options)
    -> kj::Promise<CallResult<CallValue<Fn, capnp::Capability::Client>>> {
  using Value = CallValue<Fn, capnp::Capability::Client>;
  return callWith(erase<Value>(kj::fwd<Fn>(fn)), options, true)
      .then([](CallResult<kj::Own<AnyResponse>>&& result) {
        return unwrapResult<Value>(kj::mv(result));
      });
}

template <typename Fn>
auto ActorPoolBase::broadcastCapability(Fn&& fn, CallOptions options)
    -> BroadcastFuture<CallValue<Fn, capnp::Capability::Client>> {
  using Value = CallValue<Fn, capnp::Capability::Client>;
  return BroadcastFuture<Value>(broadcastWith(erase<Value>(kj::fwd<Fn>(fn)), options));
}

}  // namespace troupe
