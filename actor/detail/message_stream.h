#pragma once
// The framing layer under every troupe RPC connection: Cap'n Proto's standard stream framing
// (segment table, then segments), with troupe's message limit enforced before anything is
// allocated, and a traversal budget that lets a receiver read a message's contents more than
// once.

#include <capnp/serialize-async.h>
#include <kj/async-io.h>

namespace troupe::detail {

// How many times over a received message may be traversed. Cap'n Proto counts every read of a
// pointer's target against the message's traversal limit; with a limit equal to the message
// size, a 256 MiB payload could be fetched from its reader only twice.
constexpr uint64_t TRAVERSAL_FACTOR = 8;

// Borrows `stream`, which must outlive it. Loop thread only.
class BoundedMessageStream final : public capnp::MessageStream {
public:
  BoundedMessageStream(kj::AsyncIoStream& stream, uint64_t maxMessageBytes);

  // Rejects (closing the connection, as any read error does) with MESSAGE_TOO_LARGE when the
  // segment table announces more than maxMessageBytes, before reading the segments; with
  // FAILED for a malformed segment table; with DISCONNECTED when the stream ends mid-message.
  // Resolves to null on a clean end of stream.
  kj::Promise<kj::Maybe<capnp::MessageReaderAndFds>> tryReadMessage(
      kj::ArrayPtr<kj::AutoCloseFd> fdSpace, capnp::ReaderOptions options,
      kj::ArrayPtr<capnp::word> scratchSpace) override;

  kj::Promise<void> writeMessage(
      kj::ArrayPtr<const int> fds,
      kj::ArrayPtr<const kj::ArrayPtr<const capnp::word>> segments) override;
  kj::Promise<void> writeMessages(
      kj::ArrayPtr<kj::ArrayPtr<const kj::ArrayPtr<const capnp::word>>> messages) override;
  kj::Maybe<int> getSendBufferSize() override;
  kj::Promise<void> end() override;

private:
  kj::Promise<kj::Maybe<capnp::MessageReaderAndFds>> readRest(capnp::ReaderOptions options);

  kj::AsyncIoStream& stream;
  const uint64_t maxMessageBytes;
  uint32_t header[2];
};

}  // namespace troupe::detail
