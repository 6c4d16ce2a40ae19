#include "troupe/resolver/endpoint_publisher.h"

#include <kj/vector.h>

namespace troupe {

EndpointPublisher::EndpointPublisher(ActorServer& server, Resolver& resolver) : resolver(resolver) {
  // Told of the current endpoints at once: everything else must be ready.
  listening = server.addEndpointListener(*this);
}

EndpointPublisher::~EndpointPublisher() noexcept(false) = default;

kj::Promise<void> EndpointPublisher::whenPublished() {
  kj::Vector<kj::Promise<void>> all;
  for (auto& [name, p] : published) all.add(p.registered.addBranch());
  return kj::joinPromises(all.releaseAsArray());
}

void EndpointPublisher::endpointChanged(const Endpoint& endpoint) {
  auto it = published.find(endpoint.name);
  if (it == published.end()) {
    // Registered STARTING first, so watchers see the endpoint before it takes calls.
    Endpoint starting = endpoint;
    starting.state = EndpointState::STARTING;
    auto registration = resolver.registerEndpoint(kj::mv(starting));
    auto registered = registration->whenRegistered().fork();
    it =
        published.emplace(endpoint.name, Published{kj::mv(registration), kj::mv(registered)}).first;
  }
  if (endpoint.state != EndpointState::STARTING) it->second.registration->setState(endpoint.state);
}

void EndpointPublisher::endpointRemoved(const Endpoint& endpoint) {
  published.erase(endpoint.name);
}

}  // namespace troupe
