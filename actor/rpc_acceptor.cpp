#include "troupe/actor/rpc_acceptor.h"

#include <spdlog/spdlog.h>

#include "troupe/actor/detail/listen_socket.h"
#include "troupe/actor/detail/rpc_connection.h"
#include "troupe/actor/errors.h"

namespace troupe {

struct RpcAcceptor::Listener {
  actor_detail::ListenSocket socket;
  std::string text;
};

// One accepted connection; lives in connectionTasks until its peer goes.
class RpcAcceptor::Connection {
public:
  Connection(RpcAcceptor& acceptor, kj::Own<kj::AsyncIoStream> stream, bool direct)
      : acceptor(acceptor),
        rpc(kj::mv(stream), acceptor.bootstrap, acceptor.maxMessageBytes, direct) {
    acceptor.connections.insert(this);
  }
  ~Connection() noexcept(false) { acceptor.connections.erase(this); }

  // rpc.whenWritten(), settled when the connection goes.
  kj::Promise<void> whenWritten() {
    return writes.wrap(rpc.whenWritten()).catch_([](kj::Exception&&) {});
  }

  RpcAcceptor& acceptor;
  actor_detail::RpcConnection rpc;
  kj::Canceler writes;  // declared after rpc: waits on its writes end before it goes
};

RpcAcceptor::RpcAcceptor(EventLoop& loop, capnp::Capability::Client bootstrap,
                         uint64_t maxMessageBytes, std::shared_ptr<spdlog::logger> log,
                         kj::StringPtr what, std::shared_ptr<Credentials> credentials)
    : loop(loop),
      bootstrap(kj::mv(bootstrap)),
      maxMessageBytes(maxMessageBytes),
      log(kj::mv(log)),
      what(what.cStr()),
      credentials(credentials ? kj::mv(credentials) : loop.credentials()),
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
  l->socket = actor_detail::openListenSocket(loop.lowLevelIo(), address);
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
    if (l->socket.ownsPath) actor_detail::removeSocketFile(l->socket.bound);
  }
  listeners.clear();
  bound_.clear();
}

void RpcAcceptor::closeConnections() { connectionTasks = kj::heap<kj::TaskSet>(*this); }

void RpcAcceptor::taskFailed(kj::Exception&& exception) {
  // A peer that sent garbage or hung up: its connection closes, the others keep being served.
  log->debug("{} connection ended: {}", what, exception.getDescription().cStr());
}

kj::Promise<void> RpcAcceptor::serve(kj::Own<kj::AsyncIoStream> stream, bool direct) {
  auto connection = kj::heap<Connection>(*this, kj::mv(stream), direct);
  auto disconnected = connection->rpc.onDisconnect();
  return disconnected.attach(kj::mv(connection));
}

kj::Promise<void> RpcAcceptor::acceptLoop(Listener& l) {
  return l.socket.receiver->accept().then(
      [this, &l](kj::Own<kj::AsyncIoStream> stream) {
        if (l.socket.bound.kind == Address::Kind::TLS) {
          // The handshake runs among the connections, so that closing them cancels it.
          connectionTasks->add(
              credentials->wrapServer(loop.timer(), kj::mv(stream))
                  .then(
                      [this](kj::Own<kj::AsyncIoStream> tls) { return serve(kj::mv(tls), false); },
                      [this, &l](kj::Exception&& e) {
                        log->warn("{} on {}: {}", what, l.text, e.getDescription().cStr());
                      }));
        } else {
          connectionTasks->add(serve(kj::mv(stream), true));
        }
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

}  // namespace troupe
