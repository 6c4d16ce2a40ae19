#include "troupe/actor/actor_ref.h"

#include <kj/debug.h>
#include <spdlog/spdlog.h>

#include "troupe/actor/endpoint.h"
#include "troupe/base/errors.h"
#include "troupe/net/limits.h"

namespace troupe {

namespace actor_detail {

// What copies of one ActorRef share. Loop thread only.
class ActorRefState final : public kj::Refcounted,
                            public MetricsSource,
                            private kj::TaskSet::ErrorHandler {
public:
  ActorRefState(kj::Own<Channel> channel, kj::StringPtr actorName, ActorRefOptions options)
      : channel(kj::mv(channel)), actorName(actorName), options(kj::mv(options)), tasks(*this) {
    if (this->options.metrics) metricsRegistration = this->channel->loop().metrics().add(*this);
  }

  void collectMetrics(MetricsSnapshot& out) const override {
    MetricLabels labels = {{"peer", channel->address().toString()}, {"actor", actorName}};
    auto withCode = [&](const char* code, uint64_t value) {
      auto l = labels;
      l.emplace_back("code", code);
      out.add("troupe_ref_calls_total",
              "Calls through ActorRefs finished, by outcome: ok, cancelled (by the caller), or "
              "the error code the caller got.",
              MetricType::COUNTER, kj::mv(l), static_cast<double>(value));
    };
    withCode("ok", outcomes.ok);
    if (outcomes.cancelled != 0) withCode("cancelled", outcomes.cancelled);
    for (size_t i = 0; i < CallOutcomes::CODES; ++i) {
      if (outcomes.errors[i] != 0) {
        withCode(errorCodeName(static_cast<ErrorCode>(i)).cStr(), outcomes.errors[i]);
      }
    }
    out.add("troupe_ref_calls_in_flight", "Calls through ActorRefs not finished.",
            MetricType::GAUGE, labels, static_cast<double>(inFlight));
    out.addHistogram("troupe_ref_call_duration_seconds",
                     "Latency of calls through ActorRefs as the caller sees it, the connection "
                     "attempt included.",
                     labels, latency);
  }

  kj::Exception deadlineError(kj::Duration deadline) const {
    return makeError(ErrorCode::DEADLINE_EXCEEDED,
                     kj::str("call to '", actorName, "' at ", channel->address().toString(),
                             " did not finish within ", deadline / kj::MILLISECONDS,
                             " ms; it may have run"));
  }

  // A call made on connection `epoch` failed with `e`.
  void callFailed(const kj::Exception& e, uint64_t epoch) {
    // A broken connection fails calls with DISCONNECTED before the channel may have noticed;
    // drop it now so the next call connects again. A DISCONNECTED error the actor itself passed
    // on comes from the peer and says nothing about this connection.
    if (e.getType() != kj::Exception::Type::DISCONNECTED) return;
    if (fromPeer(e)) return;
    if (epoch == channel->epoch()) channel->disconnect();
  }

  kj::Own<Channel> channel;
  const std::string actorName;
  const ActorRefOptions options;
  kj::Maybe<capnp::Capability::Client> actor;  // for connection `actorEpoch`
  uint64_t actorEpoch = 0;
  kj::Maybe<uint64_t> incarnation;
  kj::TaskSet tasks;  // the lookups of the actor

  // Calls counted, when options.metrics is true.
  CallOutcomes outcomes;
  LatencyHistogram latency;
  uint64_t inFlight = 0;

private:
  void taskFailed(kj::Exception&& exception) override {
    channel->loop().logger()->debug("looking up actor '{}': {}", actorName,
                                    exception.getDescription().cStr());
  }

  MetricsSet::Registration metricsRegistration;  // last: goes first
};

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

capnp::Capability::Client ActorRefBase::capability() {
  auto& s = *state;
  s.channel->dropIfClosing();
  KJ_IF_MAYBE(actor, s.actor) {
    if (s.actorEpoch == s.channel->epoch()) return *actor;
  }
  // Ask the host for the actor and use the answer's capability at once (promise pipelining):
  // the first call needs no extra round trip.
  auto host = s.channel->host();
  uint64_t epoch = s.channel->epoch();
  auto request = host.getActorRequest();
  request.setName(s.actorName);
  auto response = request.send();
  capnp::Capability::Client pipelined = response.getActor();
  s.actor = pipelined;
  s.actorEpoch = epoch;
  // Once answered, call the actor directly rather than through the pipeline.
  s.tasks.add(response.then(
      [&s, epoch](capnp::Response<schema::ActorHost::GetActorResults>&& r) {
        s.incarnation = r.getIncarnation();
        if (s.actorEpoch == epoch) s.actor = r.getActor();
      },
      [&s, epoch](kj::Exception&& e) {
        // Look it up again next time (it may be hosted later, or the connection may be new).
        if (s.actorEpoch == epoch) s.actor = nullptr;
        kj::throwFatalException(kj::mv(e));
      }));
  return pipelined;
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
