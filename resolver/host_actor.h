#pragma once
// hostActor: the one-liner a replica's main() uses.
//
//   int main() {
//     troupe::EventLoop loop;
//     return troupe::hostActor<ParameterServer>(loop, "ps", kj::heap<ParameterServerImpl>(dims));
//   }

#include <memory>
#include <string>

#include "troupe/actor/actor_server.h"
#include "troupe/actor/job_context.h"
#include "troupe/base/event_loop.h"

namespace troupe {

struct HostOptions {
  // Where to listen; "" (the default) means ActorServer::defaultListenAddress(): 127.0.0.1, or
  // 0.0.0.0 when the job names an advertise host (TROUPE_ADVERTISE_HOST) so that other machines
  // can reach it; tls:// when the credentials hold a certificate (TROUPE_TLS_CERT).
  std::string listen;

  // The server's settings (drain grace period, message limit, ...).
  ActorServerOptions server;

  // The actor's settings (concurrency, cancellation).
  ActorOptions actor;
};

// Serves `server` as a replica of `job`: listens if it does not yet, publishes its endpoints in
// the job's resolver (job.resolver, when set: registry://, fixed:, file:), serves until SIGTERM,
// SIGINT or a drain request, drains, and unpublishes. Blocks: call it from main() (it waits on
// the loop). Throws what listening or opening the resolver throws, and the resolver's refusal
// of the registration (JOB_ENDED, NAME_TAKEN, INVALID_ARGUMENT). Refuses (INVALID_ARGUMENT) to
// serve on an address other machines may reach when the server's credentials let anyone in
// (refuseOpenListener), unless TROUPE_INSECURE=1.
void serveReplica(EventLoop& loop, ActorServer& server);

class EndpointPublisher;
class Resolver;

// What keeps a replica's endpoints published: dropping it releases their leases (after a drain
// has removed them).
struct PublishedReplica {
  ~PublishedReplica() noexcept(false);
  kj::Own<Resolver> resolver;            // null without a resolver
  kj::Own<EndpointPublisher> publisher;  // declared after the resolver: goes first
};

// serveReplica() up to serving: listens (guarded) if the server does not yet, publishes its
// endpoints in the job's resolver and waits until they are. For a host that then serves in its
// own way (the Python module's: on a thread of its own, stopped by its caller).
kj::Own<PublishedReplica> publishReplica(EventLoop& loop, ActorServer& server);

// server.listen(address), after refusing (INVALID_ARGUMENT) an address other machines may reach
// when the server's credentials let anyone in (refuseOpenListener), unless TROUPE_INSECURE=1:
// what serveReplica() checks, done before anyone can connect. Returns the address bound.
std::string listenGuarded(ActorServer& server, kj::StringPtr address);

// Hosts `impl` as actor `name` of interface T in a replica of the job this process belongs to
// (JobContext::fromEnvironment()), and serves it with serveReplica(). Returns the process's exit
// status: 0 after a clean stop, 1 (having logged why) when the replica could not start.
template <typename T, typename Impl>
int hostActor(EventLoop& loop, kj::StringPtr name, kj::Own<Impl> impl, HostOptions options = {});

namespace resolver_detail {
// hostActor's untyped part: everything after the actor exists.
int hostCapability(EventLoop& loop, kj::StringPtr name, capnp::InterfaceSchema schema,
                   capnp::Capability::Client actor, HostOptions options);
}  // namespace resolver_detail

template <typename T, typename Impl>
int hostActor(EventLoop& loop, kj::StringPtr name, kj::Own<Impl> impl, HostOptions options) {
  static_assert(std::is_base_of_v<typename T::Server, Impl>,
                "hostActor<T>(loop, name, impl): impl must implement T::Server");
  return resolver_detail::hostCapability(loop, name, capnp::Schema::from<T>(),
                                         capnp::Capability::Client(kj::mv(impl)), kj::mv(options));
}

}  // namespace troupe
