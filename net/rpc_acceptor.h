#pragma once
// RpcAcceptor: the listening side of troupe's servers (ActorServer, RegistryServer), and of any
// server built on troupe's transport. Accepts connections on any number of addresses and serves
// one bootstrap capability to each over Cap'n Proto RPC, on troupe's own framing and message
// limit, behind an Authenticator (schemas/actor.capnp): a connection gets the capability once it
// presents the cluster token of the acceptor's credentials (or any token when they hold none, or
// a client certificate under mutual TLS), and is closed after 3 refusals. What its peers can
// make it hold is bounded by its ConnectionLimits (limits.h).

#include <memory>
#include <set>
#include <string>

#include <capnp/capability.h>
#include <kj/async.h>
#include <kj/function.h>

#include "troupe/base/event_loop.h"
#include "troupe/base/metrics.h"
#include "troupe/net/address.h"
#include "troupe/net/credentials.h"
#include "troupe/net/limits.h"
#include "troupe/net/same_host.h"
#include "troupe/net/segment_placement.h"

namespace spdlog {
class logger;
}

namespace troupe {

namespace net_detail {
class IncomingBudget;
struct TimeoutCounters;
}  // namespace net_detail

// Belongs to `loop`. Dropping it closes every listener (removing the unix socket files it made)
// and every connection.
class RpcAcceptor final : public kj::TaskSet::ErrorHandler {
public:
  // `what` names the server in log lines ("actor server", "registry"). `credentials`: what a
  // tls:// listener presents and checks clients with; null for the loop's.
  RpcAcceptor(EventLoop& loop, capnp::Capability::Client bootstrap, uint64_t maxMessageBytes,
              std::shared_ptr<spdlog::logger> log, kj::StringPtr what,
              std::shared_ptr<Credentials> credentials = nullptr, ConnectionLimits limits = {});
  ~RpcAcceptor() noexcept(false);
  KJ_DISALLOW_COPY(RpcAcceptor);

  // Listens on `address` (see ActorServer::listen) and returns the address bound. A tls://
  // address needs credentials that can serve TLS (else INVALID_ARGUMENT); each connection on it
  // is served once its TLS handshake completes, and one whose handshake fails is closed (and
  // logged).
  Address listen(kj::StringPtr address);

  // The addresses listened on now, in the order listen() bound them.
  kj::ArrayPtr<const Address> bound() const { return bound_; }

  // Connections being served now (past their TLS handshake, if any).
  size_t connectionCount() const { return connections.size(); }

  // Bytes the messages still arriving on its connections hold now (see ConnectionLimits).
  uint64_t incompleteMessageBytes() const;

  // Resolves once every connection has written what it queued so far (a connection that closes
  // meanwhile counts as done).
  kj::Promise<void> whenWritten();

  // What crossed its connections so far.
  const TransportCounters& transport() const { return counters; }

  // Adds its connection and message series to `out`, each with `labels`.
  void collectMetrics(MetricsSnapshot& out, const MetricLabels& labels) const;

  // Offers the large last segment of every message its connections receive from now on to
  // `placement` (segment_placement.h), which must outlive the acceptor.
  void placeSegmentsWith(SegmentPlacement& placement) { this->placement = placement; }

  // Has each connection from now on served the capability `make(peer)` returns rather than the
  // bootstrap given: `peer` is the client's process where it runs as this process's user on a
  // unix socket (localPeerOf(), same_host.h), else null.
  using PeerBootstrap =
      kj::Function<capnp::Capability::Client(std::shared_ptr<const LocalPeer> peer)>;
  void bootstrapPerConnection(PeerBootstrap make) { bootstrapFor = kj::mv(make); }

  // Stops accepting: closes the listeners and removes their socket files.
  void closeListeners();

  // Closes every connection (calls in flight on them fail with DISCONNECTED at the peer).
  void closeConnections();

private:
  struct Listener;
  class Connection;

  void taskFailed(kj::Exception&& exception) override;
  kj::Promise<void> acceptLoop(Listener& listener);
  // Serves one connection behind its own Authenticator (`certified`: it came with a verified
  // client certificate, which stands for the cluster token).
  // `acceptedAt` starts its first-message timeout.
  kj::Promise<void> serve(kj::Own<kj::AsyncIoStream> stream, bool direct, bool certified,
                          kj::TimePoint acceptedAt);
  // A connection to a tls:// listener: its handshake, then serve().
  kj::Promise<void> acceptTls(kj::Own<kj::AsyncIoStream> stream, std::string listenerText,
                              kj::TimePoint acceptedAt);
  // A connection past maxConnections is closed; says so at most once a second.
  void refuse(kj::AsyncIoStream& stream);

  EventLoop& loop;
  capnp::Capability::Client bootstrap;
  kj::Maybe<PeerBootstrap> bootstrapFor;
  uint64_t maxMessageBytes;
  std::shared_ptr<spdlog::logger> log;
  std::string what;
  std::shared_ptr<Credentials> credentials;  // never null
  const ConnectionLimits limits;
  kj::Own<net_detail::IncomingBudget> budget;     // outlives the connections, which claim from it
  kj::Own<net_detail::TimeoutCounters> timeouts;  // outlives the connections, which count there
  size_t open = 0;                                // accepted and not yet closed
  kj::Maybe<SegmentPlacement&> placement;
  TransportCounters counters;
  uint64_t refusedSinceLog = 0;
  kj::Maybe<kj::TimePoint> lastRefusalLog;
  kj::Vector<kj::Own<Listener>> listeners;
  kj::Vector<Address> bound_;
  std::set<Connection*> connections;
  kj::Own<kj::TaskSet> acceptTasks;
  kj::Own<kj::TaskSet> connectionTasks;
};

}  // namespace troupe
