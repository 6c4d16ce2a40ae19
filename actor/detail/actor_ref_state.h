#pragma once
// What copies of one ActorRef share: the connection, the actor's capability on it, the calls'
// counters, and the caller identity its ExactlyOnce calls carry (once_call.h).

#include <cstdint>
#include <deque>
#include <string>

#include <capnp/capability.h>
#include <kj/async.h>
#include <kj/refcount.h>
#include <kj/vector.h>

#include "troupe/actor/actor_ref.h"
#include "troupe/base/metrics.h"
#include "troupe/net/channel.h"
#include "troupe/schemas/actor.capnp.h"

namespace troupe::actor_detail {

// The calls of one ActorRef as a caller of ExactlyOnce calls: its id, the sequence numbers it
// gave, and which of them it may still retry (the rest it acknowledges with its next call).
class CallerIdentity {
public:
  CallerIdentity();
  KJ_DISALLOW_COPY(CallerIdentity);

  uint64_t id() const { return id_; }

  // A new sequence number, outstanding until release().
  uint64_t allocate();
  // The call with `seq` ended: the caller will not ask for its reply again.
  void release(uint64_t seq);

  // Fills a hello for a lookup on a new connection (CallerHello in actor.capnp).
  void fillHello(schema::CallerHello::Builder hello) const;
  // The lookup that carried the hello was answered: the server knows this caller.
  void greeted() { greeted_ = true; }

  // Puts the acknowledgements owed into `params`.
  void fillAcks(schema::ExactlyOnce::CallParams::Builder params);

private:
  uint64_t id_;
  uint64_t nextSeq = 1;
  // Lowest outstanding, or nextSeq when none.
  uint64_t lowest() const { return outstanding.empty() ? nextSeq : outstanding.front(); }

  std::deque<uint64_t> outstanding;  // ascending: mostly released from the front
  kj::Vector<uint64_t> acks;         // released above the lowest outstanding, not yet sent
  bool greeted_ = false;
};

// Loop thread only.
class ActorRefState final : public kj::Refcounted,
                            public MetricsSource,
                            private kj::TaskSet::ErrorHandler {
public:
  ActorRefState(kj::Own<Channel> channel, kj::StringPtr actorName, ActorRefOptions options);

  void collectMetrics(MetricsSnapshot& out) const override;

  kj::Exception deadlineError(kj::Duration deadline) const;

  // A call made on connection `epoch` failed with `e`.
  void callFailed(const kj::Exception& e, uint64_t epoch);

  // The actor's capability on the current connection, connecting and looking it up if needed
  // (ActorRefBase::capability()).
  capnp::Capability::Client actorCapability();

  // Resolves once the lookup on the current connection was answered: then the server knows
  // this caller, and `incarnation` is its incarnation. Rejects when the lookup fails.
  kj::Promise<void> lookedUp();

  kj::Own<Channel> channel;
  const std::string actorName;
  const ActorRefOptions options;
  kj::Maybe<capnp::Capability::Client> actor;  // for connection `actorEpoch`
  uint64_t actorEpoch = 0;
  uint64_t answeredEpoch = 0;                 // the connection whose lookup was last answered
  kj::Maybe<kj::ForkedPromise<void>> lookup;  // of connection `actorEpoch`
  kj::Maybe<uint64_t> incarnation;
  CallerIdentity caller;
  kj::TaskSet tasks;  // the lookups of the actor, ExactlyOnce cancellations

  // Calls counted, when options.metrics is true.
  CallOutcomes outcomes;
  LatencyHistogram latency;
  uint64_t inFlight = 0;

private:
  void taskFailed(kj::Exception&& exception) override;

  MetricsSet::Registration metricsRegistration;  // last: goes first
};

}  // namespace troupe::actor_detail
