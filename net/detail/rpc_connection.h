#pragma once
// One Cap'n Proto RPC connection over a byte stream, with troupe's message limit. The server
// side serves a bootstrap capability; the client side reaches the server's.

#include <capnp/rpc-twoparty.h>
#include <kj/async-io.h>

#include "troupe/net/detail/message_stream.h"
#include "troupe/net/detail/rpc_network.h"

namespace troupe::net_detail {

// Belongs to the loop thread that made the stream. Dropping it closes the connection: calls in
// flight on it fail with DISCONNECTED on the other side.
class RpcConnection {
public:
  // Server side: serves `bootstrap` to the peer. `direct`: `stream` is a socket itself, not a
  // TLS stream over one (BoundedMessageStream). `limits` bound what the peer makes it read.
  RpcConnection(kj::Own<kj::AsyncIoStream> stream, capnp::Capability::Client bootstrap,
                uint64_t maxMessageBytes, bool direct, kj::Maybe<ReadLimits> limits = nullptr);
  // Client side.
  RpcConnection(kj::Own<kj::AsyncIoStream> stream, uint64_t maxMessageBytes, bool direct);
  KJ_DISALLOW_COPY(RpcConnection);

  // The peer's bootstrap capability (client side).
  capnp::Capability::Client bootstrap();

  // Offers large last segments of incoming messages to `placement` (message_stream.h), which
  // must outlive the connection.
  void placeSegmentsWith(SegmentPlacement& placement) { messages.placeSegmentsWith(placement); }

  // Counts this connection's messages into `counters`, which must outlive it.
  void countInto(TransportCounters& counters) { messages.countInto(counters); }

  // Large messages through shared memory with a peer on this host (BoundedMessageStream).
  void useSharedMemory(bool initiate, std::shared_ptr<spdlog::logger> log) {
    messages.useSharedMemory(initiate, kj::mv(log));
  }
  // Calls `moved` as bytes of large messages move either way (BoundedMessageStream); what it
  // refers to must outlive the connection.
  void onLargeMessageProgress(kj::Function<void(size_t bytes)> moved) {
    messages.onLargeMessageProgress(kj::mv(moved));
  }

  // Resolves when the peer disconnects or the connection fails.
  kj::Promise<void> onDisconnect() { return network.onDisconnect(); }

  // True once the connection is going down: no call sent now could reach the peer.
  bool closing() const { return network.isShutDown(); }

  // Resolves once every message sent so far has been written, or writing failed. The
  // connection must outlive the promise.
  kj::Promise<void> whenWritten() { return network.whenWritten(); }

private:
  kj::Own<kj::AsyncIoStream> stream;
  BoundedMessageStream messages;
  RpcNetwork network;
  capnp::RpcSystem<capnp::rpc::twoparty::VatId> rpc;
};

}  // namespace troupe::net_detail
