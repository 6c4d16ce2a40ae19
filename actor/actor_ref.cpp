#include "troupe/actor/actor_ref.h"

#include <kj/debug.h>
#include <spdlog/spdlog.h>

#include "troupe/actor/endpoint.h"
#include "troupe/actor/errors.h"

namespace troupe {

namespace actor_detail {

// What copies of one ActorRef share. Loop thread only.
class ActorRefState final : public kj::Refcounted, private kj::TaskSet::ErrorHandler {
public:
  ActorRefState(kj::Own<Channel> channel, kj::StringPtr actorName, ActorRefOptions options)
      : channel(kj::mv(channel)), actorName(actorName), options(kj::mv(options)), tasks(*this) {}

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

private:
  void taskFailed(kj::Exception&& exception) override {
    channel->loop().logger()->debug("looking up actor '{}': {}", actorName,
                                    exception.getDescription().cStr());
  }
};

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

kj::Promise<uint64_t> ActorRefBase::ping(CallOptions options) {
  auto promise = state->channel->host().pingRequest().send().then(
      [s = kj::addRef(*state)](capnp::Response<schema::ActorHost::PingResults>&& r) mutable {
        s->incarnation = r.getIncarnation();
        return r.getIncarnation();
      });
  return finishCall(kj::mv(promise), options);
}

kj::StringPtr ActorRefBase::actorName() const { return state->actorName; }

// A handle's constness is not its connection's (as with a const pointer to a mutable object).
Channel& ActorRefBase::channel() const {
  return *const_cast<actor_detail::ActorRefState&>(*state).channel;
}

}  // namespace troupe
