#include "fuzz/recording_proxy.h"

#include <kj/vector.h>

#include "troupe/net/address.h"

namespace troupe::fuzz {

namespace {

// One proxied connection: the client's bytes go on to the server and into `sent`; the server's
// go back untouched.
class Session {
public:
  Session(kj::Own<kj::AsyncIoStream> client, kj::Own<kj::AsyncIoStream> server)
      : client(kj::mv(client)), server(kj::mv(server)) {}

  kj::Promise<kj::Array<kj::byte>> run() {
    back = server->pumpTo(*client)
               .then([this](uint64_t) { client->shutdownWrite(); })
               .catch_([](kj::Exception&&) {})
               .eagerlyEvaluate(nullptr);
    return forward().then([this]() { return sent.releaseAsArray(); });
  }

private:
  kj::Promise<void> forward() {
    return client->tryRead(buffer, 1, sizeof(buffer)).then([this](size_t n) -> kj::Promise<void> {
      if (n == 0) {
        server->shutdownWrite();
        return kj::READY_NOW;
      }
      sent.addAll(kj::arrayPtr(buffer, n));
      return server->write(buffer, n).then([this]() { return forward(); });
    });
  }

  kj::Own<kj::AsyncIoStream> client;
  kj::Own<kj::AsyncIoStream> server;
  kj::Vector<kj::byte> sent;
  kj::byte buffer[4096];
  kj::Promise<void> back = nullptr;
};

}  // namespace

RecordingProxy::RecordingProxy(EventLoop& loop, kj::StringPtr serverAddress)
    : server(loop.network()
                 .parseAddress(Address::parse(serverAddress).toKjAddress())
                 .wait(loop.waitScope())),
      listener(loop.network().parseAddress("127.0.0.1", 0).wait(loop.waitScope())->listen()) {}

std::string RecordingProxy::address() {
  return "tcp://127.0.0.1:" + std::to_string(listener->getPort());
}

kj::Promise<kj::Array<kj::byte>> RecordingProxy::record() {
  return listener->accept().then([this](kj::Own<kj::AsyncIoStream> client) {
    return server->connect().then(
        [client = kj::mv(client)](kj::Own<kj::AsyncIoStream> upstream) mutable {
          auto session = kj::heap<Session>(kj::mv(client), kj::mv(upstream));
          auto done = session->run();
          return done.attach(kj::mv(session));
        });
  });
}

}  // namespace troupe::fuzz
