#pragma once
// The Cap'n Proto VatNetwork under every troupe RPC connection: two parties over one
// BoundedMessageStream. It does what capnp::TwoPartyVatNetwork does, and differs where speed
// is at stake:
//  - an outgoing message goes to the framing layer the moment Cap'n Proto sends it (the
//    framing layer keeps writes in order), not one loop turn later behind a promise per write;
//  - outgoing messages are built in segments whose large ones come from buffer_cache.h, so a
//    64 MiB response is written into memory that is already mapped instead of 16384 fresh pages.

#include <capnp/message.h>
#include <capnp/rpc-twoparty.h>
#include <kj/async.h>

#include "troupe/net/detail/message_stream.h"

namespace troupe::net_detail {

// Writes one Cap'n Proto RPC Abort message (`reason`, kind DISCONNECTED) to `stream` in the
// standard framing, for a peer that will be served nothing else: its RPC system fails its calls
// with `reason`. `stream` must outlive the promise.
kj::Promise<void> writeAbort(kj::AsyncOutputStream& stream, kj::StringPtr reason);

// Borrows `messages`, which must outlive it. Loop thread only.
class RpcNetwork final : public capnp::TwoPartyVatNetworkBase,
                         private capnp::TwoPartyVatNetworkBase::Connection,
                         private capnp::RpcFlowController::WindowGetter,
                         private kj::TaskSet::ErrorHandler {
public:
  // Messages over `maxMessageBytes` are refused in both directions: an outgoing one fails its
  // call with MESSAGE_TOO_LARGE before anything is written, an incoming one closes the
  // connection (BoundedMessageStream).
  RpcNetwork(BoundedMessageStream& messages, capnp::rpc::twoparty::Side side,
             uint64_t maxMessageBytes);
  ~RpcNetwork() noexcept(false);
  KJ_DISALLOW_COPY(RpcNetwork);

  // Resolves once the RPC system has dropped the connection (the peer left, or it failed).
  kj::Promise<void> onDisconnect() { return disconnected.addBranch(); }

  // True once Cap'n Proto shut the connection down (it failed, or the peer aborted it), which
  // it does as it fails the calls in flight, before onDisconnect() resolves.
  bool isShutDown() const { return shutDown; }

  // Resolves once every message sent so far has been written (BoundedMessageStream::whenWritten).
  kj::Promise<void> whenWritten() { return messages.whenWritten(); }

  // VatNetwork.
  kj::Maybe<kj::Own<capnp::TwoPartyVatNetworkBase::Connection>> connect(
      capnp::rpc::twoparty::VatId::Reader ref) override;
  kj::Promise<kj::Own<capnp::TwoPartyVatNetworkBase::Connection>> accept() override;

  class OutgoingMessage;

private:
  class ConnectionDisposer final : public kj::Disposer {
  public:
    explicit ConnectionDisposer(RpcNetwork& network) : network(network) {}
    void disposeImpl(void*) const override;
    RpcNetwork& network;
  };

  kj::Own<capnp::TwoPartyVatNetworkBase::Connection> asConnection();
  void send(OutgoingMessage& message);

  // Connection.
  kj::Own<capnp::RpcFlowController> newStream() override;
  capnp::rpc::twoparty::VatId::Reader getPeerVatId() override;
  kj::Own<capnp::OutgoingRpcMessage> newOutgoingMessage(capnp::uint firstSegmentWordSize) override;
  kj::Promise<kj::Maybe<kj::Own<capnp::IncomingRpcMessage>>> receiveIncomingMessage() override;
  kj::Promise<void> shutdown() override;

  // WindowGetter: the socket's send buffer, as Cap'n Proto's own network does.
  size_t getWindow() override;

  void taskFailed(kj::Exception&& exception) override;

  BoundedMessageStream& messages;
  const capnp::rpc::twoparty::Side side;
  const uint64_t maxMessageBytes;
  const capnp::ReaderOptions receiveOptions;
  capnp::MallocMessageBuilder peerVatId;
  bool accepted = false;
  bool shutDown = false;

  mutable size_t connectionRefs = 0;
  ConnectionDisposer connectionDisposer;
  kj::Own<kj::PromiseFulfiller<void>> disconnectFulfiller;
  kj::ForkedPromise<void> disconnected;
  kj::Own<kj::PromiseFulfiller<kj::Own<capnp::TwoPartyVatNetworkBase::Connection>>> acceptFulfiller;

  kj::TaskSet largeWrites;  // writes made from a message's own segments, each keeping it alive
};

}  // namespace troupe::net_detail
