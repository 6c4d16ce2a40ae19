#pragma once
// The gate in front of every hosted actor: it admits calls arriving over RPC one at a time (or
// up to the actor's concurrency), refuses them once the server drains, lets callers cancel them,
// and counts what is in flight so a drain knows when it may close connections.
//
// The gate is a capnp::ClientHook wrapping the implementation's own local client, so a call's
// parameters and results are never copied and the implementation's thisCap() keeps working.

#include <cstdint>
#include <list>
#include <string>

#include <capnp/capability.h>
#include <kj/async.h>

#include "actor/actor_server.h"

namespace troupe::detail {

// Counts the calls accepted by all gates of one server. Loop thread only.
class CallTracker {
public:
  void begin() { ++inFlight_; }
  void end();
  uint64_t inFlight() const { return inFlight_; }

  // Resolves once no call is in flight.
  kj::Promise<void> whenIdle();

  // Once set, gates refuse new calls with DRAINING.
  bool draining = false;

private:
  uint64_t inFlight_ = 0;
  kj::Vector<kj::Own<kj::PromiseFulfiller<void>>> idleWaiters;
};

class CallSlot;

// One hosted actor: its implementation, its info and its admission state.
class HostedActor {
public:
  HostedActor(kj::StringPtr name, capnp::InterfaceSchema schema, capnp::Capability::Client impl,
              ActorOptions options, CallTracker& tracker);
  KJ_DISALLOW_COPY(HostedActor);

  // The capability handed to callers: the gate.
  capnp::Capability::Client client();

  const std::string name;
  const capnp::InterfaceSchema schema;
  const ActorOptions options;

private:
  friend class ActorGate;
  friend class CallSlot;

  // A finished call gives its slot to the oldest waiting call, or frees it.
  void releaseSlot();

  kj::Own<capnp::ClientHook> impl;
  CallTracker& tracker;
  uint32_t running = 0;
  std::list<CallSlot*> waiting;
  kj::Own<capnp::ClientHook> gate;
};

}  // namespace troupe::detail
