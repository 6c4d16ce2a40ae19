#pragma once
// The gate in front of every hosted actor: it admits calls arriving over RPC one at a time (or
// up to the actor's concurrency), refuses them once the server drains, lets callers cancel them,
// and keeps every call in progress where the server can count it and, when it goes away, end it.
//
// The gate is a capnp::ClientHook wrapping the implementation's own local client, so a call's
// parameters and results are never copied and the implementation's thisCap() keeps working.

#include <cstdint>
#include <list>
#include <string>
#include <vector>

#include <capnp/capability.h>
#include <kj/async.h>
#include <kj/list.h>
#include <kj/vector.h>

#include "troupe/actor/actor_server.h"
#include "troupe/actor/detail/reply_cache.h"
#include "troupe/base/change_signal.h"
#include "troupe/base/metrics.h"

namespace troupe::actor_detail {

class CallTracker;
class CallSlot;
class HostedActor;

// Told how a call that reached the gate ended, once, as it ends: refused, finished (inside the
// call's own continuation, before its promise resolves) or ended by CallTracker::abortAll(). The
// ExactlyOnce side keeps its reply then, without a continuation of its own. Not told of a call
// dropped (cancelled) before it ended. Loop thread only; held by the call's completion until
// told.
class CallEndListener {
public:
  virtual void callEnded(kj::Maybe<const kj::Exception&> failure) = 0;

protected:
  ~CallEndListener() = default;
};

// The promise adapter behind every call's completion: it owns the call's work, its slot and its
// listener, and is listed in the tracker until the call ends. Internal to the gate.
class CallCompletion {
public:
  CallCompletion(kj::PromiseFulfiller<void>& fulfiller, CallTracker& tracker,
                 const std::string& actorName, kj::Own<CallSlot> slot, kj::Promise<void> work,
                 kj::Maybe<kj::Own<CallEndListener>> listener);
  ~CallCompletion() noexcept(false);
  KJ_DISALLOW_COPY(CallCompletion);

  // Ends the call now: destroys its work, frees its slot, rejects with `reason`.
  void abort(const kj::Exception& reason);

  kj::ListLink<CallCompletion> link;

private:
  // Accounts for the call's end: `failure` null for a success.
  void done(kj::Maybe<const kj::Exception&> failure);

  kj::PromiseFulfiller<void>& fulfiller;
  kj::Maybe<CallTracker&> tracker;  // null once the call ended
  const std::string& actorName;     // the HostedActor's, which outlives the call's accounting
  kj::Own<CallSlot> slot;
  kj::Maybe<kj::Own<CallEndListener>> listener;
  kj::Promise<void> work;
};

// Counts and holds the calls accepted by all gates of one server. Loop thread only.
class CallTracker {
public:
  CallTracker() = default;
  ~CallTracker() noexcept(false);
  KJ_DISALLOW_COPY(CallTracker);

  void begin() { ++inFlight_; }
  void end();
  uint64_t inFlight() const { return inFlight_; }

  // Resolves once no call is in flight.
  kj::Promise<void> whenIdle();

  // Ends every call still in progress: its work (the promise its method returned, or its place
  // in a queue) is destroyed before this returns, and its caller, if still connected, gets
  // `reason`. Cap'n Proto completes a cancellation only on a later turn of the loop; this makes
  // sure no actor code runs, and no state it refers to is touched, once the server is gone.
  void abortAll(const kj::Exception& reason);

  // Once set, gates refuse new calls with DRAINING.
  bool draining = false;

private:
  friend class CallCompletion;
  uint64_t inFlight_ = 0;
  ChangeSignal idle;  // notified when inFlight_ drops to 0
  kj::List<CallCompletion, &CallCompletion::link> calls;
};

// The counters of one method of a hosted actor, kept on the loop as calls pass the gate.
struct MethodCounters {
  uint64_t interfaceId;
  uint16_t methodId;
  kj::StringPtr name;    // from the compiled schema; "unknown" for calls to no method it has
  uint64_t started = 0;  // every call that reached the gate, refused ones included
  uint64_t inFlight = 0;
  CallOutcomes outcomes;
  LatencyHistogram latency;  // from arrival at the gate to the method's promise completing
};

// One hosted actor: its implementation, its info, its admission state and its counters.
class HostedActor {
public:
  // `counting`: whether calls are counted and timed (ActorServerOptions::metrics). `replies`:
  // the server's memory of ExactlyOnce calls.
  HostedActor(kj::StringPtr name, capnp::InterfaceSchema schema, capnp::Capability::Client impl,
              ActorOptions options, CallTracker& tracker, ReplyCache& replies, kj::Timer& timer,
              bool counting);
  KJ_DISALLOW_COPY(HostedActor);

  // The capability handed to callers: the gate.
  capnp::Capability::Client client();

  // Adds this actor's series to `out`, labelled with `job`.
  void collectMetrics(MetricsSnapshot& out, kj::StringPtr job) const;

  const std::string name;
  const capnp::InterfaceSchema schema;
  const ActorOptions options;

private:
  friend class ActorGate;
  friend class CallSlot;

  // The counters of the method a call names (the "unknown" entry when it names none).
  MethodCounters& countersFor(uint64_t interfaceId, uint16_t methodId);

  // A finished call gives its slot to the oldest waiting call, or frees it.
  void releaseSlot();
  // Every slot is taken and the queue is at its bound: a new call is refused.
  bool full() const;

  kj::Own<capnp::ClientHook> impl;
  CallTracker& tracker;
  ReplyCache& replies;
  kj::Timer& timer;
  const bool counting;
  uint32_t running = 0;
  std::list<CallSlot*> waiting;
  std::vector<MethodCounters> methods;  // the schema's methods in order, then "unknown"
  LatencyHistogram queueWait;           // from arrival to a slot, for every call that ran
  kj::Own<capnp::ClientHook> gate;
};

}  // namespace troupe::actor_detail
