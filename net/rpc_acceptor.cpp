#include "troupe/net/rpc_acceptor.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <spdlog/spdlog.h>

#include "troupe/base/errors.h"
#include "troupe/net/detail/message_stream.h"
#include "troupe/net/detail/rpc_connection.h"
#include "troupe/net/detail/tls_sniff.h"
#include "troupe/net/listen_socket.h"
#include "troupe/net/same_host.h"
#include "troupe/schemas/actor.capnp.h"

namespace troupe {

struct RpcAcceptor::Listener {
  ListenSocket socket;
  std::string text;
};

namespace {

// After this many refused authentications a connection is closed.
constexpr uint32_t MAX_FAILED_AUTHENTICATIONS = 3;

// Who is at the other end of a connection.
struct Peer {
  kj::String name;  // "127.0.0.1:5555", "[::1]:5555" or "a unix socket", for log lines
  kj::String host;  // "127.0.0.1", "::1"; empty for a unix socket or an unknown peer
};

Peer peerOf(kj::AsyncIoStream& stream) {
  struct sockaddr_storage addr;
  uint len = sizeof(addr);
  KJ_IF_MAYBE(e, kj::runCatchingExceptions([&]() {
                stream.getpeername(reinterpret_cast<struct sockaddr*>(&addr), &len);
              })) {
    (void)e;
    return {kj::str("an unknown peer"), kj::str()};
  }
  char host[INET6_ADDRSTRLEN] = "?";
  if (addr.ss_family == AF_INET) {
    auto& in = reinterpret_cast<struct sockaddr_in&>(addr);
    inet_ntop(AF_INET, &in.sin_addr, host, sizeof(host));
    return {kj::str(host, ':', ntohs(in.sin_port)), kj::str(host)};
  }
  if (addr.ss_family == AF_INET6) {
    auto& in6 = reinterpret_cast<struct sockaddr_in6&>(addr);
    inet_ntop(AF_INET6, &in6.sin6_addr, host, sizeof(host));
    return {kj::str('[', host, "]:", ntohs(in6.sin6_port)), kj::str(host)};
  }
  return {kj::str("a unix socket"), kj::str()};
}

kj::String peerName(kj::AsyncIoStream& stream) {
  auto peer = peerOf(stream);
  return kj::mv(peer.name);
}

// The bootstrap capability of one connection: it hands out the server's own once the
// connection has authenticated (schemas/actor.capnp, Authenticator), and has the connection
// closed after MAX_FAILED_AUTHENTICATIONS refusals.
class Gate final : public schema::Authenticator::Server {
public:
  Gate(capnp::Capability::Client service, std::shared_ptr<Credentials> credentials,
       std::shared_ptr<spdlog::logger> log, kj::StringPtr what, kj::String peer, bool certified,
       kj::Own<kj::PromiseFulfiller<void>> close)
      : service(kj::mv(service)),
        credentials(kj::mv(credentials)),
        log(kj::mv(log)),
        what(kj::str(what)),
        peer(kj::mv(peer)),
        certified(certified),
        close(kj::mv(close)) {}

protected:
  kj::Promise<void> authenticate(AuthenticateContext context) override {
    auto token = context.getParams().getToken();
    // A server that requires client certificates lets in no one uncertified but token holders
    // (its plain listeners included), and one with neither token nor that requirement, anyone.
    bool open = !credentials->hasToken() && !credentials->requiresClientCertificates();
    if (certified || open || credentials->tokenMatches(token)) {
      context.getResults().setService(service);
      return kj::READY_NOW;
    }
    ++failures;
    bool closing = failures >= MAX_FAILED_AUTHENTICATIONS;
    log->warn("{}: refused a connection from {}: {} cluster token ({} of {} tries{})", what.cStr(),
              peer.cStr(), token.size() == 0 ? "no" : "a wrong", failures,
              MAX_FAILED_AUTHENTICATIONS, closing ? "; closing it" : "");
    if (closing) close->fulfill();
    if (!credentials->hasToken()) {
      return makeError(ErrorCode::UNAUTHENTICATED,
                       "this server lets in only clients with a certificate from its CA, over "
                       "tls:// (mutual TLS)");
    }
    return makeError(ErrorCode::UNAUTHENTICATED,
                     token.size() == 0
                         ? "this server requires the cluster token, and none was presented "
                           "(TROUPE_TOKEN_FILE or TROUPE_TOKEN, or CredentialsOptions::token)"_kj
                         : "the cluster token presented is not this server's"_kj);
  }

private:
  capnp::Capability::Client service;
  std::shared_ptr<Credentials> credentials;
  std::shared_ptr<spdlog::logger> log;
  kj::String what;
  kj::String peer;
  bool certified;  // a client certificate under mutual TLS stands for the token
  uint32_t failures = 0;
  kj::Own<kj::PromiseFulfiller<void>> close;
};

}  // namespace

// One accepted connection; lives in connectionTasks until its peer goes.
class RpcAcceptor::Connection {
public:
  Connection(RpcAcceptor& acceptor, kj::Own<kj::AsyncIoStream> stream,
             capnp::Capability::Client gate, bool direct, net_detail::ReadLimits limits)
      : acceptor(acceptor),
        rpc(kj::mv(stream), kj::mv(gate), acceptor.maxMessageBytes, direct, kj::mv(limits)) {
    acceptor.connections.insert(this);
    ++acceptor.counters.connectionsAccepted;
    rpc.countInto(acceptor.counters);
    rpc.useSharedMemory(false, acceptor.log);  // for a client on a unix socket that offers it
    KJ_IF_MAYBE(p, acceptor.placement) {
      rpc.placeSegmentsWith(*p);
    }
  }
  ~Connection() noexcept(false) { acceptor.connections.erase(this); }

  // rpc.whenWritten(), settled when the connection goes.
  kj::Promise<void> whenWritten() {
    return writes.wrap(rpc.whenWritten()).catch_([](kj::Exception&&) {});
  }

  RpcAcceptor& acceptor;
  net_detail::RpcConnection rpc;
  kj::Canceler writes;  // declared after rpc: waits on its writes end before it goes
};

RpcAcceptor::RpcAcceptor(EventLoop& loop, capnp::Capability::Client bootstrap,
                         uint64_t maxMessageBytes, std::shared_ptr<spdlog::logger> log,
                         kj::StringPtr what, std::shared_ptr<Credentials> credentials,
                         ConnectionLimits limits)
    : loop(loop),
      bootstrap(kj::mv(bootstrap)),
      maxMessageBytes(maxMessageBytes),
      log(kj::mv(log)),
      what(what.cStr()),
      credentials(credentials ? kj::mv(credentials) : loopCredentials(loop)),
      limits(limits),
      budget(kj::heap<net_detail::IncomingBudget>(limits.maxIncompleteMessageBytes)),
      timeouts(kj::heap<net_detail::TimeoutCounters>()),
      acceptTasks(kj::heap<kj::TaskSet>(*this)),
      connectionTasks(kj::heap<kj::TaskSet>(*this)) {}

RpcAcceptor::~RpcAcceptor() noexcept(false) {
  closeConnections();
  closeListeners();
}

Address RpcAcceptor::listen(kj::StringPtr text) {
  auto address = Address::parse(text);
  if (address.kind == Address::Kind::TLS && !credentials->canServeTls()) {
    throwError(ErrorCode::INVALID_ARGUMENT,
               kj::str("cannot listen on ", address.toString(),
                       ": TLS needs a certificate and its key (TlsOptions certFile and keyFile, "
                       "or TROUPE_TLS_CERT and TROUPE_TLS_KEY)"));
  }
  auto l = kj::heap<Listener>();
  l->socket = openListenSocket(loop.lowLevelIo(), address);
  l->text = l->socket.bound.toString();
  auto bound = l->socket.bound;
  auto& ref = *l;
  listeners.add(kj::mv(l));
  bound_.add(bound);
  acceptTasks->add(acceptLoop(ref));
  return bound;
}

kj::Promise<void> RpcAcceptor::whenWritten() {
  auto writes = kj::heapArrayBuilder<kj::Promise<void>>(connections.size());
  for (auto* c : connections) writes.add(c->whenWritten());
  return kj::joinPromises(writes.finish());
}

void RpcAcceptor::closeListeners() {
  acceptTasks = kj::heap<kj::TaskSet>(*this);
  for (auto& l : listeners) {
    l->socket.receiver = nullptr;
    if (l->socket.ownsPath) removeSocketFile(l->socket.bound);
  }
  listeners.clear();
  bound_.clear();
}

uint64_t RpcAcceptor::incompleteMessageBytes() const { return budget->held(); }

void RpcAcceptor::closeConnections() { connectionTasks = kj::heap<kj::TaskSet>(*this); }

void RpcAcceptor::taskFailed(kj::Exception&& exception) {
  // A peer that sent garbage or hung up: its connection closes, the others keep being served.
  log->debug("{} connection ended: {}", what, exception.getDescription().cStr());
}

kj::Promise<void> RpcAcceptor::serve(kj::Own<kj::AsyncIoStream> stream, bool direct, bool certified,
                                     kj::TimePoint acceptedAt) {
  auto close = kj::newPromiseAndFulfiller<void>();
  auto peer = peerOf(*stream);
  net_detail::ReadLimits reads{loop.timer(),
                               acceptedAt + limits.firstMessageTimeout,
                               limits.firstMessageTimeout,
                               limits.messageTimeout,
                               *budget,
                               *timeouts,
                               log,
                               kj::str(what, ": connection from ", peer.name).cStr(),
                               peer.host.cStr()};
  auto service = bootstrap;
  KJ_IF_MAYBE(make, bootstrapFor) {
    std::shared_ptr<const LocalPeer> local;
    KJ_IF_MAYBE(fd, stream->getFd()) {
      local = localPeerOf(*fd);
    }
    service = (*make)(kj::mv(local));
  }
  capnp::Capability::Client gate = kj::heap<Gate>(kj::mv(service), credentials, log, what,
                                                  kj::mv(peer.name), certified,
                                                  kj::mv(close.fulfiller));
  auto connection = kj::heap<Connection>(*this, kj::mv(stream), kj::mv(gate), direct,
                                         kj::mv(reads));
  auto& rpc = connection->rpc;
  // Closed after too many refusals, once the last refusal has been written.
  auto closed = close.promise.then([&rpc]() { return rpc.whenWritten(); });
  return rpc.onDisconnect().exclusiveJoin(kj::mv(closed)).attach(kj::mv(connection));
}

kj::Promise<void> RpcAcceptor::acceptTls(kj::Own<kj::AsyncIoStream> stream,
                                         std::string listenerText, kj::TimePoint acceptedAt) {
  // A plain client is told to use TLS instead (tls_sniff.h). Its first byte and the handshake
  // must come within the handshake timeout.
  auto limit = KJ_ASSERT_NONNULL(credentials->tls()).handshakeTimeout;
  auto deadline = loop.timer().now() + limit;
  auto timeout = loop.timer().atTime(deadline).then(
      [limit]() -> kj::Maybe<kj::Own<kj::AsyncIoStream>> {
        kj::throwFatalException(
            makeError(ErrorCode::DISCONNECTED,
                      kj::str("no TLS handshake began within ", limit / kj::MILLISECONDS, " ms")));
      });
  return net_detail::sniffTls(kj::mv(stream), listenerText)
      .exclusiveJoin(kj::mv(timeout))
      .then([this, deadline](kj::Maybe<kj::Own<kj::AsyncIoStream>> tls)
                -> kj::Promise<kj::Own<kj::AsyncIoStream>> {
        KJ_IF_MAYBE(s, tls) {
          return credentials->wrapServer(loop.timer(), kj::mv(*s), deadline);
        }
        return makeError(ErrorCode::DISCONNECTED,
                         "a client that does not speak TLS was told to use it, and closed");
      })
      .then(
          [this, acceptedAt](kj::Own<kj::AsyncIoStream> tls) {
            return serve(kj::mv(tls), false, credentials->requiresClientCertificates(), acceptedAt);
          },
          [this, listenerText](kj::Exception&& e) {
            log->warn("{} on {}: {}", what, listenerText, e.getDescription().cStr());
          });
}

void RpcAcceptor::refuse(kj::AsyncIoStream& stream) {
  ++counters.connectionsRefused;
  ++refusedSinceLog;
  auto now = loop.timer().now();
  KJ_IF_MAYBE(last, lastRefusalLog) {
    if (now - *last < 1 * kj::SECONDS) return;
  }
  lastRefusalLog = now;
  log->warn("{}: closed {} connection(s) as they came, the latest from {}: {} are open, the most "
            "ConnectionLimits::maxConnections allows",
            what, refusedSinceLog, peerName(stream).cStr(), open);
  refusedSinceLog = 0;
}

kj::Promise<void> RpcAcceptor::acceptLoop(Listener& l) {
  return l.socket.receiver->accept().then(
      [this, &l](kj::Own<kj::AsyncIoStream> stream) {
        if (open >= limits.maxConnections) {
          refuse(*stream);  // and close it, as `stream` goes
          return acceptLoop(l);
        }
        auto now = loop.timer().now();
        auto served = l.socket.bound.kind == Address::Kind::TLS
                          ? acceptTls(kj::mv(stream), l.text, now)
                          : serve(kj::mv(stream), true, false, now);
        ++open;
        connectionTasks->add(served.attach(kj::defer([this]() { --open; })));
        return acceptLoop(l);
      },
      [this, &l](kj::Exception&& e) {
        // Out of file descriptors, say: keep the listener and try again shortly.
        log->warn("{}: accept on {} failed: {}; retrying in 100 ms", what, l.text,
                  e.getDescription().cStr());
        return loop.timer().afterDelay(100 * kj::MILLISECONDS).then([this, &l]() {
          return acceptLoop(l);
        });
      });
}

void RpcAcceptor::collectMetrics(MetricsSnapshot& out, const MetricLabels& labels) const {
  auto add = [&](kj::StringPtr name, kj::StringPtr help, MetricType type, double value) {
    out.add(name, help, type, labels, value);
  };
  auto counter = [&](kj::StringPtr name, kj::StringPtr help, uint64_t value) {
    add(name, help, MetricType::COUNTER, static_cast<double>(value));
  };
  add("troupe_connections_open", "Connections being served now.", MetricType::GAUGE,
      static_cast<double>(connections.size()));
  counter("troupe_connections_accepted_total", "Connections served since the server started.",
          counters.connectionsAccepted);
  counter("troupe_connections_refused_total",
          "Connections closed as they came, past ConnectionLimits::maxConnections.",
          counters.connectionsRefused);
  counter("troupe_messages_received_total", "Messages read from connections.",
          counters.messagesReceived);
  counter("troupe_messages_sent_total", "Messages queued to connections.", counters.messagesSent);
  counter("troupe_received_bytes_total", "Bytes of messages read, framing included.",
          counters.bytesReceived);
  counter("troupe_sent_bytes_total", "Bytes of messages sent, framing included.",
          counters.bytesSent);
  counter("troupe_large_messages_received_total", "Messages read of 64 KiB or more.",
          counters.largeMessagesReceived);
  counter("troupe_large_messages_sent_total", "Messages sent of 64 KiB or more.",
          counters.largeMessagesSent);
  counter("troupe_shared_messages_received_total",
          "Messages read through shared memory (same host).", counters.sharedMessagesReceived);
  counter("troupe_shared_messages_sent_total", "Messages sent through shared memory (same host).",
          counters.sharedMessagesSent);
  add("troupe_incomplete_message_bytes", "Bytes held by messages still arriving.",
      MetricType::GAUGE, static_cast<double>(incompleteMessageBytes()));
  add("troupe_incomplete_messages_waiting",
      "Messages still arriving that wait for their share of "
      "ConnectionLimits::maxIncompleteMessageBytes.",
      MetricType::GAUGE, static_cast<double>(budget->waiting()));
  auto timedOut = [&](kj::StringPtr timeout, uint64_t value) {
    auto withTimeout = labels;
    withTimeout.emplace_back("timeout", timeout.cStr());
    out.add("troupe_connections_timed_out_total",
            "Connections closed for ConnectionLimits::firstMessageTimeout (first_message) or "
            "messageTimeout (message).",
            MetricType::COUNTER, kj::mv(withTimeout), static_cast<double>(value));
  };
  timedOut("first_message", timeouts->firstMessage);
  timedOut("message", timeouts->message);
}

}  // namespace troupe
