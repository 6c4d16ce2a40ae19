#include "troupe/actor/detail/actor_ref_state.h"

#include <sys/random.h>

#include <algorithm>

#include <kj/debug.h>
#include <spdlog/spdlog.h>

#include "troupe/base/errors.h"

namespace troupe::actor_detail {

namespace {

// Replies acknowledged one by one (above the lowest outstanding call) that a caller remembers
// to send; past it the server drops them after its retention time instead.
constexpr size_t MAX_PENDING_ACKS = 256;
// Sent with one call.
constexpr size_t MAX_ACKS_PER_CALL = 64;

uint64_t randomCallerId() {
  // Not the loop's seeded generator: two processes seeded alike must not share an id, and
  // another peer must not guess it (SECURITY.md).
  uint64_t id = 0;
  while (id == 0) KJ_SYSCALL(getrandom(&id, sizeof(id), 0));
  return id;
}

}  // namespace

CallerIdentity::CallerIdentity() : id_(randomCallerId()) {}

uint64_t CallerIdentity::allocate() {
  uint64_t seq = nextSeq++;
  outstanding.push_back(seq);
  return seq;
}

void CallerIdentity::release(uint64_t seq) {
  auto it = std::lower_bound(outstanding.begin(), outstanding.end(), seq);
  if (it == outstanding.end() || *it != seq) return;
  outstanding.erase(it);
  if (!outstanding.empty() && seq > outstanding.front() && acks.size() < MAX_PENDING_ACKS) {
    acks.add(seq);
  }
}

void CallerIdentity::fillHello(schema::CallerHello::Builder hello) const {
  hello.setCallerId(id_);
  // A server that has seen this caller before and no longer knows it dropped what it kept (or
  // restarted): every retry below the next number may have run. One that never saw it can run
  // any retry: nothing was sent to it yet.
  hello.setFloor(greeted_ ? nextSeq : lowest());
}

void CallerIdentity::fillAcks(schema::ExactlyOnce::CallParams::Builder params) {
  uint64_t below = lowest();
  params.setAckBelow(below);
  if (acks.empty()) return;
  kj::Vector<uint64_t> send;
  kj::Vector<uint64_t> keep;
  for (uint64_t seq : acks) {
    if (seq < below) continue;  // covered by `below`
    if (send.size() < MAX_ACKS_PER_CALL) {
      send.add(seq);
    } else {
      keep.add(seq);
    }
  }
  acks = kj::mv(keep);
  auto list = params.initAcks(send.size());
  for (uint i = 0; i < send.size(); ++i) list.set(i, send[i]);
}

// ------------------------------------------------------------------------------------------------

ActorRefState::ActorRefState(kj::Own<Channel> channel, kj::StringPtr actorName,
                             ActorRefOptions options)
    : channel(kj::mv(channel)), actorName(actorName), options(kj::mv(options)), tasks(*this) {
  if (this->options.metrics) metricsRegistration = this->channel->loop().metrics().add(*this);
}

void ActorRefState::collectMetrics(MetricsSnapshot& out) const {
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
  out.add("troupe_ref_calls_in_flight", "Calls through ActorRefs not finished.", MetricType::GAUGE,
          labels, static_cast<double>(inFlight));
  out.addHistogram("troupe_ref_call_duration_seconds",
                   "Latency of calls through ActorRefs as the caller sees it, the connection "
                   "attempt included.",
                   labels, latency);
}

kj::Exception ActorRefState::deadlineError(kj::Duration deadline) const {
  return makeError(ErrorCode::DEADLINE_EXCEEDED,
                   kj::str("call to '", actorName, "' at ", channel->address().toString(),
                           " did not finish within ", deadline / kj::MILLISECONDS,
                           " ms; it may have run"));
}

void ActorRefState::callFailed(const kj::Exception& e, uint64_t epoch) {
  // A broken connection fails calls with DISCONNECTED before the channel may have noticed;
  // drop it now so the next call connects again. A DISCONNECTED error the actor itself passed
  // on comes from the peer and says nothing about this connection.
  if (e.getType() != kj::Exception::Type::DISCONNECTED) return;
  if (fromPeer(e)) return;
  if (epoch == channel->epoch()) channel->disconnect();
}

capnp::Capability::Client ActorRefState::actorCapability() {
  channel->dropIfClosing();
  KJ_IF_MAYBE(a, actor) {
    if (actorEpoch == channel->epoch()) return *a;
  }
  // Ask the host for the actor and use the answer's capability at once (promise pipelining):
  // the first call needs no extra round trip.
  auto host = channel->host();
  uint64_t epoch = channel->epoch();
  auto request = host.getActorRequest();
  request.setName(actorName);
  // Only a handle that sends calls to run once introduces itself: the server keeps a little
  // for each caller.
  if (options.exactlyOnce) caller.fillHello(request.initCaller());
  auto response = request.send();
  capnp::Capability::Client pipelined = response.getActor();
  actor = pipelined;
  actorEpoch = epoch;
  // Once answered, call the actor directly rather than through the pipeline.
  auto answered = response
                      .then(
                          [this, epoch](capnp::Response<schema::ActorHost::GetActorResults>&& r) {
                            caller.greeted();
                            if (actorEpoch != epoch) return;
                            incarnation = r.getIncarnation();
                            actor = r.getActor();
                            answeredEpoch = epoch;
                          },
                          [this, epoch](kj::Exception&& e) {
                            // Look it up again next time (it may be hosted later, or the connection
                            // may be new).
                            if (actorEpoch == epoch) actor = nullptr;
                            kj::throwFatalException(kj::mv(e));
                          })
                      .fork();
  tasks.add(answered.addBranch());
  lookup = kj::mv(answered);
  return pipelined;
}

kj::Promise<void> ActorRefState::lookedUp() {
  actorCapability();
  if (answeredEpoch == actorEpoch && actorEpoch == channel->epoch()) return kj::READY_NOW;
  return KJ_ASSERT_NONNULL(lookup).addBranch();
}

void ActorRefState::taskFailed(kj::Exception&& exception) {
  channel->loop().logger()->debug("actor '{}': {}", actorName, exception.getDescription().cStr());
}

}  // namespace troupe::actor_detail
