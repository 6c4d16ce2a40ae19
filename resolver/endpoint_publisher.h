#pragma once
// EndpointPublisher: publishes an ActorServer's endpoints in a resolver.

#include <map>
#include <string>

#include <kj/async.h>

#include "troupe/actor/actor_server.h"
#include "troupe/resolver/resolver.h"

namespace troupe {

// Keeps one registration per endpoint of `server` in `resolver`: each endpoint is registered
// STARTING, set READY once the registration is accepted and the server serves, DRAINING when it
// drains, and removed when it stops. Borrows both, which must outlive it; it listens to the
// server's endpoints while it lives (dropping it stops that and removes the registrations).
// Loop thread only.
class EndpointPublisher final : private EndpointListener {
public:
  EndpointPublisher(ActorServer& server, Resolver& resolver);
  ~EndpointPublisher() noexcept(false);
  KJ_DISALLOW_COPY(EndpointPublisher);

  // Resolves once every endpoint the server has now is registered; rejects with the first
  // refusal (INVALID_ARGUMENT, JOB_ENDED, NAME_TAKEN, ...).
  kj::Promise<void> whenPublished();

private:
  void endpointChanged(const Endpoint& endpoint) override;
  void endpointRemoved(const Endpoint& endpoint) override;

  struct Published {
    kj::Own<Registration> registration;
    kj::ForkedPromise<void> registered;
  };

  Resolver& resolver;
  std::map<std::string, Published> published;   // by endpoint name
  ActorServer::ListenerRegistration listening;  // goes first: it calls into the rest
};

}  // namespace troupe
