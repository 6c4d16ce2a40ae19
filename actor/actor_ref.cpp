#include "troupe/actor/actor_ref.h"

#include <kj/debug.h>
#include <spdlog/spdlog.h>

#include "troupe/actor/detail/actor_ref_state.h"
#include "troupe/actor/detail/once_call.h"
#include "troupe/actor/endpoint.h"
#include "troupe/base/errors.h"
#include "troupe/net/limits.h"

namespace troupe {

namespace actor_detail {

CallRecord::CallRecord(ActorRefState& state)
    : state(kj::addRef(state)), startedAt(state.channel->loop().timer().now()) {
  ++state.inFlight;
}

CallRecord::~CallRecord() noexcept(false) {
  --state->inFlight;
  if (!done) {
    ++state->outcomes.cancelled;
    state->latency.record(state->channel->loop().timer().now() - startedAt);
  }
}

void CallRecord::finished(kj::Maybe<const kj::Exception&> failure) {
  if (done) return;
  done = true;
  KJ_IF_MAYBE(e, failure) {
    state->outcomes.countError(errorCode(*e));
  } else {
    ++state->outcomes.ok;
  }
  state->latency.record(state->channel->loop().timer().now() - startedAt);
}

}  // namespace actor_detail

ActorRefBase::ActorRefBase(kj::Own<Channel> channel, kj::StringPtr actorName,
                           ActorRefOptions options) {
  validateActorName(actorName);
  state = kj::refcounted<actor_detail::ActorRefState>(kj::mv(channel), actorName, kj::mv(options));
}

// Copies share the state: it is reference-counted, and sharing it is what copying means here.
ActorRefBase::ActorRefBase(const ActorRefBase& other)
    : state(kj::addRef(const_cast<actor_detail::ActorRefState&>(*other.state))) {}

ActorRefBase& ActorRefBase::operator=(const ActorRefBase& other) {
  state = kj::addRef(const_cast<actor_detail::ActorRefState&>(*other.state));
  return *this;
}

ActorRefBase::ActorRefBase(ActorRefBase&& other) noexcept = default;
ActorRefBase& ActorRefBase::operator=(ActorRefBase&& other) noexcept = default;
ActorRefBase::~ActorRefBase() noexcept(false) {}

ActorRefBase::FailureWatch::FailureWatch(const ActorRefBase& ref)
    : state(kj::addRef(const_cast<actor_detail::ActorRefState&>(*ref.state))),
      epoch(state->channel->epoch()) {}
ActorRefBase::FailureWatch::FailureWatch(FailureWatch&& other) noexcept = default;
ActorRefBase::FailureWatch::~FailureWatch() noexcept(false) {}

void ActorRefBase::FailureWatch::failed(const kj::Exception& e) { state->callFailed(e, epoch); }

kj::Maybe<kj::Own<actor_detail::CallRecord>> ActorRefBase::startRecord() {
  if (!state->options.metrics) return nullptr;
  return kj::heap<actor_detail::CallRecord>(*state);
}

MetricsSnapshot ActorRefBase::metrics() const {
  MetricsSnapshot out;
  if (state->options.metrics) state->collectMetrics(out);
  return out;
}

kj::Maybe<kj::Duration> ActorRefBase::deadlineOf(const CallOptions& options) const {
  KJ_IF_MAYBE(d, options.deadline) {
    return *d;
  }
  return state->options.defaultDeadline;
}

kj::Promise<void> ActorRefBase::expiry(kj::Duration deadline) const {
  auto& s = const_cast<actor_detail::ActorRefState&>(*state);
  return s.channel->loop().timer().afterDelay(deadline).then(
      [s = kj::addRef(s), deadline]() -> kj::Promise<void> { return s->deadlineError(deadline); });
}

capnp::Capability::Client ActorRefBase::capability() { return state->actorCapability(); }

bool ActorRefBase::sendsOnce(const CallOptions& options) const {
  return !options.idempotent && state->options.exactlyOnce;
}

ActorRefBase::OnceHandle::OnceHandle(const ActorRefBase& ref)
    : call(kj::refcounted<actor_detail::OnceCall>(
          const_cast<actor_detail::ActorRefState&>(*ref.state))) {}
ActorRefBase::OnceHandle::~OnceHandle() noexcept(false) {}

capnp::Capability::Client ActorRefBase::OnceHandle::attempt() { return call->attempt(); }

kj::Promise<void> ActorRefBase::OnceHandle::failed(kj::Exception&& e) {
  return call->failed(kj::mv(e));
}

kj::Maybe<uint64_t> ActorRefBase::incarnation() const { return state->incarnation; }

kj::Exception ActorRefBase::notSent(kj::Exception&& e) const {
  KJ_IF_MAYBE(tooLarge, tooLargeToBuild(e, state->channel->maxMessageBytes())) {
    return kj::mv(*tooLarge);
  }
  return kj::mv(e);
}

kj::Promise<uint64_t> ActorRefBase::ping(CallOptions options) {
  auto promise = state->channel->host().pingRequest().send().then(
      [s = kj::addRef(*state)](capnp::Response<schema::ActorHost::PingResults>&& r) mutable {
        s->incarnation = r.getIncarnation();
        return r.getIncarnation();
      });
  // A ping asks the host, not the actor: not one of the actor's calls.
  return finishCall(kj::mv(promise), options, false);
}

kj::StringPtr ActorRefBase::actorName() const { return state->actorName; }

// A handle's constness is not its connection's (as with a const pointer to a mutable object).
Channel& ActorRefBase::channel() const {
  return *const_cast<actor_detail::ActorRefState&>(*state).channel;
}

}  // namespace troupe
