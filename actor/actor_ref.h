#pragma once
// ActorRef<T>: a client handle to one actor, hosted under a name by the ActorServer at one
// address.
//
//   auto calc = troupe::ActorRef<Calculator>::connect(loop, "tcp://127.0.0.1:40123", "calc");
//   auto r = calc.call([](Calculator::Client c) {
//                  auto q = c.addRequest(); q.setA(1); q.setB(2); return q.send(); },
//                  {.deadline = 2 * kj::SECONDS}).wait(loop.waitScope());

#include <optional>
#include <string>
#include <type_traits>

#include <capnp/capability.h>
#include <kj/async.h>
#include <kj/function.h>
#include <kj/refcount.h>

#include "troupe/base/event_loop.h"
#include "troupe/base/metrics.h"
#include "troupe/net/channel.h"

namespace troupe {

struct CallOptions {
  // The call fails with DEADLINE_EXCEEDED if it has not finished this long after call() (the
  // connection attempt, if one is needed, counts). On expiry the call is cancelled, on the server
  // too unless the actor disallows cancellation. Default: the ActorRef's default deadline.
  kj::Maybe<kj::Duration> deadline;

  // The caller's statement that running the call twice is harmless. A call that is not
  // idempotent is sent so that it runs once while the server that got it lives: when its
  // connection breaks, it is sent again to the same address with the same id, and the server
  // answers from what it kept (ActorRefOptions::exactlyOnce; README, "Errors and retries"). An
  // idempotent call is not: ActorRef does not retry it, and pools (ActorPool) send it to
  // another member.
  bool idempotent = false;
};

struct ActorRefOptions {
  // The connection's settings (message limit, connect timeout).
  ChannelOptions channel;

  // Deadline for calls whose CallOptions name none. Default: none.
  kj::Maybe<kj::Duration> defaultDeadline;

  // Whether calls are counted and timed (metrics()). Default true. An ActorGroup's members
  // count nothing here: their pool counts every attempt by member.
  bool metrics = true;

  // Whether calls not marked idempotent go through sendOnce(), so that a broken connection
  // does not leave them in doubt while the server lives. Default true. With false, such a call
  // whose connection broke fails with DISCONNECTED (and a pool's with MAY_HAVE_RUN), as plain
  // Cap'n Proto calls do.
  bool exactlyOnce = true;
};

namespace actor_detail {

// What copies of one ActorRef share (detail/actor_ref_state.h).
class ActorRefState;
// One call sent by ActorRefBase::sendOnce() (detail/once_call.h).
class OnceCall;

// One call through an ActorRef, for its metrics: in flight from construction, then counted by
// outcome and timed once finished() says how it ended, or as cancelled if dropped before.
class CallRecord {
public:
  explicit CallRecord(ActorRefState& state);
  ~CallRecord() noexcept(false);
  KJ_DISALLOW_COPY(CallRecord);

  void finished(kj::Maybe<const kj::Exception&> failure);

private:
  kj::Own<ActorRefState> state;
  kj::TimePoint startedAt;
  bool done = false;
};

// `promise`, with its outcome counted in `record`.
template <typename V>
kj::Promise<V> counted(kj::Promise<V> promise, kj::Own<CallRecord> record) {
  auto& r = *record;
  return promise
      .then(
          [&r](V&& v) -> V {
            r.finished(nullptr);
            return kj::mv(v);
          },
          [&r](kj::Exception&& e) -> V {
            r.finished(e);
            kj::throwFatalException(kj::mv(e));
          })
      .attach(kj::mv(record));
}
template <>
inline kj::Promise<void> counted(kj::Promise<void> promise, kj::Own<CallRecord> record) {
  auto& r = *record;
  return promise
      .then([&r]() { r.finished(nullptr); },
            [&r](kj::Exception&& e) {
              r.finished(e);
              kj::throwFatalException(kj::mv(e));
            })
      .attach(kj::mv(record));
}

template <typename P>
struct PromiseValue {
  static_assert(sizeof(P) == 0, "a call function must return a kj::Promise or a RemotePromise");
};
template <typename V>
struct PromiseValue<kj::Promise<V>> {
  using Type = V;
};
template <typename R>
struct PromiseValue<capnp::RemotePromise<R>> {
  using Type = capnp::Response<R>;
};

}  // namespace actor_detail

// What a call function `Fn` given a `Client` resolves to: the response of the RemotePromise it
// returns (capnp::Response<Results>), or the value of its kj::Promise. ActorRef::call,
// ActorPool::call and broadcast resolve to it.
template <typename Fn, typename Client>
using CallValue =
    typename actor_detail::PromiseValue<std::decay_t<std::invoke_result_t<Fn&, Client>>>::Type;

// The untyped part of ActorRef<T>. Copies share the same state and connection.
class ActorRefBase {
public:
  ActorRefBase(kj::Own<Channel> channel, kj::StringPtr actorName, ActorRefOptions options = {});
  ActorRefBase(const ActorRefBase& other);
  ActorRefBase& operator=(const ActorRefBase& other);
  ActorRefBase(ActorRefBase&& other) noexcept;
  ActorRefBase& operator=(ActorRefBase&& other) noexcept;
  ~ActorRefBase() noexcept(false);

  // The actor's capability on the current connection (connecting if needed). Calls on it fail
  // with ACTOR_NOT_FOUND if nothing is hosted under the name, and with DISCONNECTED once this
  // connection breaks; ask again afterwards.
  capnp::Capability::Client capability();

  // Runs `send`, which builds a request on capability() (or a chain of them) and sends it,
  // returning its promise. When `send` throws instead, the promise rejects with what it threw;
  // when that is Cap'n Proto refusing a value too large for any message (a Data of 512 MiB or
  // more), it rejects with MESSAGE_TOO_LARGE (tooLargeToBuild(), net/limits.h): the request
  // was never sent.
  template <typename V>
  kj::Promise<V> start(kj::FunctionParam<kj::Promise<V>()> send);

  // Sends the request(s) `send` makes on the actor's capability so that they run once while
  // the server that gets them lives (schemas/actor.capnp ExactlyOnce): each goes with an id, and
  // when the connection breaks after one may have left, the call connects again to the same
  // address and sends them again with the same ids; the server answers from what it kept
  // rather than running them twice. `send` is called once per attempt and kept until the call
  // ends, so it must not refer to anything that may go away before, and must make the same
  // requests each time. Rejects as the call's requests do, or with MAY_HAVE_RUN when the server
  // restarted, can no longer tell, or the connection broke 9 times under the call, or with
  // UNREACHABLE when the connection broke before anything left this process. Applies no
  // deadline (finishCall() does). Dropping the promise cancels the call, on the server too
  // (as ActorOptions::allowCancellation says).
  template <typename V, typename Fn>
  kj::Promise<V> sendOnce(Fn&& send);

  // Whether a call made with `options` goes through sendOnce(): it is not idempotent, and
  // ActorRefOptions::exactlyOnce is on.
  bool sendsOnce(const CallOptions& options) const;

  // Sends the request(s) `send(capability)` makes as a call made with `options` goes: through
  // sendOnce() when sendsOnce(options), `send` then kept until the call ends; else once, on
  // capability(), through start().
  template <typename V, typename Fn>
  kj::Promise<V> sendCall(const CallOptions& options, Fn&& send);

  // Applies the call's deadline (or the default one) to `promise`, drops the connection when
  // the call fails because it broke, so that the next call connects again, and counts the call
  // in metrics() (unless the options say not to).
  template <typename V>
  kj::Promise<V> finishCall(kj::Promise<V> promise, const CallOptions& options);

  // Calls made through this handle and its copies (unless ActorRefOptions::metrics is false),
  // labelled with `peer` (the address) and `actor`: troupe_ref_calls_total by `code` (ok,
  // cancelled, or the errors.h code the caller got, deadline_exceeded included),
  // troupe_ref_calls_in_flight and troupe_ref_call_duration_seconds. Also in its loop's metrics
  // (EventLoop::metrics()), where handles to the same actor at the same address add up.
  MetricsSnapshot metrics() const;

  // The hosting process's incarnation as last reported by the server; null before the first
  // successful lookup of the actor.
  kj::Maybe<uint64_t> incarnation() const;

  // Asks the server for its incarnation (and so whether it is alive).
  kj::Promise<uint64_t> ping(CallOptions options = {});

  kj::StringPtr actorName() const;
  Channel& channel() const;

private:
  // One sendOnce() call's state (actor_detail::OnceCall), kept by its OnceAttempts.
  class OnceHandle {
  public:
    explicit OnceHandle(const ActorRefBase& ref);
    ~OnceHandle() noexcept(false);
    KJ_DISALLOW_COPY(OnceHandle);

    capnp::Capability::Client attempt();
    kj::Promise<void> failed(kj::Exception&& e);

  private:
    kj::Own<actor_detail::OnceCall> call;
  };

  // The attempts of one sendOnce() call: the adapter of its promise (kj::newAdaptedPromise), so
  // that the call's state and `send` live in the promise's own node.
  template <typename V, typename Fn>
  class OnceAttempts;

  // What a call started now tells when it fails: a DISCONNECTED failure of this connection drops
  // it (ActorRefState::callFailed), so that the next call connects again.
  class FailureWatch {
  public:
    explicit FailureWatch(const ActorRefBase& ref);
    FailureWatch(FailureWatch&& other) noexcept;
    ~FailureWatch() noexcept(false);
    KJ_DISALLOW_COPY(FailureWatch);

    void failed(const kj::Exception& e);

  private:
    kj::Own<actor_detail::ActorRefState> state;
    uint64_t epoch;
  };

  // finishCall(), counting the call in metrics() when `count` is true and metrics are on.
  template <typename V>
  kj::Promise<V> finishCall(kj::Promise<V> promise, const CallOptions& options, bool count);
  // A record of a call starting now; null when this handle counts nothing.
  kj::Maybe<kj::Own<actor_detail::CallRecord>> startRecord();

  // The deadline `options` ask for, else the default one; null for none.
  kj::Maybe<kj::Duration> deadlineOf(const CallOptions& options) const;
  // Rejects with DEADLINE_EXCEEDED (naming the actor and its address) after `deadline`.
  kj::Promise<void> expiry(kj::Duration deadline) const;
  // What start() rejects with when its function threw `e`.
  kj::Exception notSent(kj::Exception&& e) const;

  kj::Own<actor_detail::ActorRefState> state;
};

// A typed handle to an actor implementing Cap'n Proto interface T. Belongs to its loop's thread.
// Connects lazily, reuses the connection for every call, and connects again on the next call
// after the connection broke. It retries only a call not marked idempotent whose connection broke,
// and only on the same server with the same id, which runs it once (sendOnce()); it never sends a
// call anywhere else.
template <typename T>
class ActorRef : public ActorRefBase {
public:
  // A handle to the actor named `actorName` at `address` ("tcp://host:port" or "unix:/path").
  // Throws INVALID_ARGUMENT for a malformed address or name; does not connect yet.
  static ActorRef connect(EventLoop& loop, kj::StringPtr address, kj::StringPtr actorName,
                          ActorRefOptions options = {}) {
    return ActorRef(Channel::open(loop, address, options.channel), actorName, options);
  }

  // A handle sharing `channel` (one connection per address for many actors).
  ActorRef(kj::Own<Channel> channel, kj::StringPtr actorName, ActorRefOptions options = {})
      : ActorRefBase(kj::mv(channel), actorName, kj::mv(options)) {}

  // A typed view of `base`, sharing its state; the caller asserts the actor implements T.
  explicit ActorRef(const ActorRefBase& base) : ActorRefBase(base) {}

  // The typed capability, for pipelining or streaming calls. See capability().
  typename T::Client client() { return capability().template castAs<T>(); }

  // Runs `fn(client)`, which makes one call (or a chain of them) and returns its promise, and
  // applies the deadline. Resolves with the response; rejects with the error taxonomy of
  // errors.h: an exception the actor raised arrives as FAILED with its message. Dropping the
  // returned promise cancels the call. A call not marked idempotent goes through sendOnce():
  // `fn` (a copy of it) is then kept until the call ends and called again for each retry.
  template <typename Fn>
  auto call(Fn&& fn, CallOptions options = {}) -> kj::Promise<CallValue<Fn, typename T::Client>> {
    using Value = CallValue<Fn, typename T::Client>;
    auto promise = sendCall<Value>(options,
                                   [fn = std::decay_t<Fn>(kj::fwd<Fn>(fn))](
                                       capnp::Capability::Client c) mutable -> kj::Promise<Value> {
                                     return fn(c.castAs<T>());
                                   });
    return finishCall(kj::mv(promise), options);
  }
};

// ---------------------------------------------------------------------------------------------

template <typename V>
kj::Promise<V> ActorRefBase::start(kj::FunctionParam<kj::Promise<V>()> send) {
  kj::Promise<V> promise = nullptr;
  KJ_IF_MAYBE(e, kj::runCatchingExceptions([&]() { promise = send(); })) {
    return notSent(kj::mv(*e));
  }
  return promise;
}

template <typename V, typename Fn>
kj::Promise<V> ActorRefBase::sendCall(const CallOptions& options, Fn&& send) {
  if (sendsOnce(options)) return sendOnce<V>(kj::fwd<Fn>(send));
  return start<V>([&]() { return send(capability()); });
}

template <typename V, typename Fn>
class ActorRefBase::OnceAttempts {
public:
  template <typename F>
  OnceAttempts(kj::PromiseFulfiller<V>& fulfiller, const ActorRefBase& ref, F&& send)
      : fulfiller(fulfiller), ref(ref), call(ref), send(kj::fwd<F>(send)) {
    next();
  }

private:
  // Each continuation replaces the promise that is not running it.
  void next() {
    attempt = ref.start<V>([&]() { return send(call.attempt()); })
                  .then([this](auto&&... v) { fulfiller.fulfill(kj::fwd<decltype(v)>(v)...); },
                        [this](kj::Exception&& e) { failed(kj::mv(e)); })
                  .eagerlyEvaluate(nullptr);
  }
  void failed(kj::Exception&& e) {
    // Nothing thrown here may be lost: the call would never end.
    KJ_IF_MAYBE(thrown, kj::runCatchingExceptions([&]() {
                  retry = call.failed(kj::mv(e))
                              .then([this]() { next(); },
                                    [this](kj::Exception&& e) { fulfiller.reject(kj::mv(e)); })
                              .eagerlyEvaluate(nullptr);
                })) {
      fulfiller.reject(kj::mv(*thrown));
    }
  }

  kj::PromiseFulfiller<V>& fulfiller;
  ActorRefBase ref;
  OnceHandle call;
  Fn send;
  kj::Promise<void> retry = nullptr;    // the wait before the next attempt
  kj::Promise<void> attempt = nullptr;  // dropped first: its requests before the call's state
};

template <typename V, typename Fn>
kj::Promise<V> ActorRefBase::sendOnce(Fn&& send) {
  return kj::newAdaptedPromise<V, OnceAttempts<V, std::decay_t<Fn>>>(*this, kj::fwd<Fn>(send));
}

template <typename V>
kj::Promise<V> ActorRefBase::finishCall(kj::Promise<V> promise, const CallOptions& options) {
  return finishCall(kj::mv(promise), options, true);
}

template <typename V>
kj::Promise<V> ActorRefBase::finishCall(kj::Promise<V> promise, const CallOptions& options,
                                        bool count) {
  kj::Maybe<kj::Own<actor_detail::CallRecord>> record;
  if (count) record = startRecord();
  // The handler rethrows rather than return a promise: a value then passes through with no
  // further node.
  promise = promise.catch_([watch = FailureWatch(*this)](kj::Exception&& e) mutable -> V {
    watch.failed(e);
    kj::throwFatalException(kj::mv(e));
  });
  KJ_IF_MAYBE(d, deadlineOf(options)) {
    // expiry() only ever rejects.
    promise = promise.exclusiveJoin(expiry(*d).then([]() -> kj::Promise<V> { KJ_UNREACHABLE; }));
  }
  KJ_IF_MAYBE(r, record) {
    return actor_detail::counted(kj::mv(promise), kj::mv(*r));
  }
  return promise;
}

}  // namespace troupe
