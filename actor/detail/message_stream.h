#pragma once
// The framing layer under every troupe RPC connection: Cap'n Proto's standard stream framing
// (segment table, then segments), with troupe's message limit enforced before anything is
// allocated, a traversal budget that lets a receiver read a message's contents more than once,
// and fewer system calls than Cap'n Proto's own stream: reads go through a buffer (one read
// usually brings a whole small message, or several), and small messages written in one turn of
// the loop leave in one write.

#include <capnp/serialize-async.h>
#include <kj/async-io.h>
#include <kj/vector.h>

namespace troupe::detail {

// How many times over a received message may be traversed. Cap'n Proto counts every read of a
// pointer's target against the message's traversal limit; with a limit equal to the message
// size, a 256 MiB payload could be fetched from its reader only twice.
constexpr uint64_t TRAVERSAL_FACTOR = 8;

// Reads ask the socket for up to this much at once. A message that does not fit is read
// straight into its own memory (what the buffer holds of it is copied there first).
constexpr size_t READ_BUFFER_BYTES = 8 * 1024;

// Messages up to this size are copied into the write batch of the current loop turn; larger
// ones are written from Cap'n Proto's own segments, after the batch.
constexpr size_t COALESCE_MAX_MESSAGE_BYTES = 16 * 1024;

// A batch that grows past this makes the writer wait for the write in flight (back-pressure).
constexpr size_t BATCH_BACKPRESSURE_BYTES = 1024 * 1024;

// Borrows `stream`, which must outlive it. Loop thread only.
class BoundedMessageStream final : public capnp::MessageStream {
public:
  BoundedMessageStream(kj::AsyncIoStream& stream, uint64_t maxMessageBytes);
  ~BoundedMessageStream() noexcept(false);

  // Rejects (closing the connection, as any read error does) with MESSAGE_TOO_LARGE when the
  // segment table announces more than maxMessageBytes, before reading the segments; with
  // FAILED for a malformed segment table; with DISCONNECTED when the stream ends mid-message.
  // Resolves to null on a clean end of stream.
  kj::Promise<kj::Maybe<capnp::MessageReaderAndFds>> tryReadMessage(
      kj::ArrayPtr<kj::AutoCloseFd> fdSpace, capnp::ReaderOptions options,
      kj::ArrayPtr<capnp::word> scratchSpace) override;

  // A small message is copied into the turn's batch and the promise resolves at once (unless
  // the batch is over BATCH_BACKPRESSURE_BYTES: then once the write in flight is done); the
  // batch is written at the end of the turn, after every earlier write. A write that fails
  // fails every later writeMessage(), and the connection's reads fail as the socket closes.
  kj::Promise<void> writeMessage(
      kj::ArrayPtr<const int> fds,
      kj::ArrayPtr<const kj::ArrayPtr<const capnp::word>> segments) override;
  kj::Promise<void> writeMessages(
      kj::ArrayPtr<kj::ArrayPtr<const kj::ArrayPtr<const capnp::word>>> messages) override;
  kj::Maybe<int> getSendBufferSize() override;

  // Writes what is batched, then shuts the stream down for writing.
  kj::Promise<void> end() override;

  // Whether everything written so far has been handed to the socket.
  bool idle() const { return batch.empty() && writesInFlight == 0; }

private:
  // Resolves once the buffer holds at least `bytes` unread bytes (reading as needed), or with
  // false at a clean end of stream before any byte of a message.
  kj::Promise<bool> fill(size_t bytes, bool atMessageStart);
  kj::Promise<kj::Maybe<capnp::MessageReaderAndFds>> readMessage(capnp::ReaderOptions options);
  kj::Promise<kj::Maybe<capnp::MessageReaderAndFds>> readBody(capnp::ReaderOptions options,
                                                              uint32_t segmentCount,
                                                              size_t tableBytes);

  // Hands the batch to the stream after every earlier write; returns the latest write.
  kj::Promise<void> flush();
  kj::Promise<void> afterWrites();
  kj::Promise<void> track(kj::Promise<void> write);

  kj::AsyncIoStream& stream;
  const uint64_t maxMessageBytes;

  kj::Array<kj::byte> readBuffer;
  size_t readBegin = 0;  // unread bytes are [readBegin, readEnd)
  size_t readEnd = 0;

  kj::Vector<kj::byte> batch;               // framed messages not yet handed to the stream
  kj::ForkedPromise<void> lastWrite;        // the latest write handed to the stream
  size_t writesInFlight = 0;
  kj::Maybe<kj::Exception> writeFailure;
  bool flushQueued = false;
  kj::Promise<void> flushLater = nullptr;   // the end-of-turn flush
};

}  // namespace troupe::detail
