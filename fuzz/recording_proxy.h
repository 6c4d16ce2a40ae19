#pragma once
// A proxy that keeps what clients send a server: how the seed corpora of the server targets are
// taken from real traffic (make_corpus.cpp).

#include <string>

#include <kj/array.h>
#include <kj/async-io.h>

#include "troupe/base/event_loop.h"

namespace troupe::fuzz {

// Listens on 127.0.0.1 (port 0) and forwards each connection it accepts to the server at
// `serverAddress`, both ways. Belongs to `loop`; the server must outlive it.
class RecordingProxy {
public:
  RecordingProxy(EventLoop& loop, kj::StringPtr serverAddress);
  KJ_DISALLOW_COPY(RecordingProxy);

  // Where clients connect: "tcp://127.0.0.1:PORT".
  std::string address();

  // Accepts the next connection and resolves, once its client has shut it down or closed it,
  // with every byte the client sent. Call it before the client connects; one at a time.
  kj::Promise<kj::Array<kj::byte>> record();

private:
  kj::Own<kj::NetworkAddress> server;
  kj::Own<kj::ConnectionReceiver> listener;
};

}  // namespace troupe::fuzz
