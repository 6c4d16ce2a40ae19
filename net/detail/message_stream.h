#pragma once
// The framing layer under every troupe RPC connection: Cap'n Proto's standard stream framing
// (segment table, then segments), with troupe's message limit enforced before anything is
// allocated, a traversal budget that lets a receiver read a message's contents more than once,
// and fewer system calls than Cap'n Proto's own stream: reads go through a buffer (one read
// usually brings a whole small message, or several), and small messages written in one turn of
// the loop leave in one write.

#include <deque>
#include <memory>
#include <string>

#include <capnp/message.h>
#include <capnp/rpc.h>
#include <kj/async-io.h>
#include <kj/function.h>
#include <kj/timer.h>
#include <kj/vector.h>

#include "troupe/base/metrics.h"
#include "troupe/net/detail/incoming_budget.h"
#include "troupe/net/detail/shared_memory.h"
#include "troupe/net/segment_placement.h"

namespace spdlog {
class logger;
}

namespace troupe::net_detail {

// Connections a server closed for each timeout of ConnectionLimits, for its metrics. Loop
// thread only.
struct TimeoutCounters {
  uint64_t firstMessage = 0;  // ConnectionLimits::firstMessageTimeout
  uint64_t message = 0;       // ConnectionLimits::messageTimeout
};

// What a server bounds each of its connections' reads by (ConnectionLimits).
struct ReadLimits {
  kj::Timer& timer;
  kj::TimePoint firstMessageBy;      // the first whole message must have arrived by then
  kj::Duration firstMessageTimeout;  // what firstMessageBy is after the connection, for logs
  kj::Duration messageTimeout;       // a message begun must be complete within this, waits included
  IncomingBudget& budget;
  TimeoutCounters& timeouts;  // counts the connection if it is closed for a timeout
  std::shared_ptr<spdlog::logger> log;
  std::string peer;      // "actor server: connection from 127.0.0.1:5555", for log lines
  std::string peerHost;  // "127.0.0.1": whose share of the budget it takes; "" for its own
};

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

// A large message's bytes (those read past the read buffer, or written apart from the batch) are
// read in steps of at least this much and written in steps of at most this much (or what is left
// of the message), each reported to onLargeMessageProgress() as it completes: a transfer shows
// progress every time this much more has moved. Small enough for a slow link to show progress
// within a pool's probe timeout, large enough to cost nothing measurable (bench/README.md).
constexpr size_t PROGRESS_STEP_BYTES = 1024 * 1024;

// A message's first grant from the budget covers whatever of it the read buffer holds.
static_assert(BUDGET_STEP_BYTES >= READ_BUFFER_BYTES);

// A batch's memory is kept for the next turn's batch up to this size.
constexpr size_t KEPT_BATCH_CAPACITY = 64 * 1024;

// A batch that grows past this is handed to the stream without waiting for the end of the turn.
constexpr size_t BATCH_FLUSH_BYTES = 1024 * 1024;

// Borrows `stream`, which must outlive it. Loop thread only.
class BoundedMessageStream {
public:
  // When `stream` is a socket itself (not TLS or another layer over one: `direct`), small
  // batches are written to its file descriptor straight away when nothing else is being
  // written, saving a trip through kj.
  // `limits` bound reads as ConnectionLimits says (a server's connections); null for none.
  BoundedMessageStream(kj::AsyncIoStream& stream, uint64_t maxMessageBytes, bool direct = true,
                       kj::Maybe<ReadLimits> limits = nullptr);
  ~BoundedMessageStream() noexcept(false);
  KJ_DISALLOW_COPY(BoundedMessageStream);

  // The next message, ready for Cap'n Proto's RPC system. Rejects (closing the connection, as any
  // read error does) with MESSAGE_TOO_LARGE when the segment table announces more than
  // maxMessageBytes, before reading the segments; with FAILED for a malformed segment table; with
  // DISCONNECTED when the stream ends mid-message. Resolves to null on a clean end of stream. When
  // the buffer already holds the whole message, the promise is ready at once. Large bodies are read
  // into memory from buffer_cache.h, or, when the server's budget grants a message in steps
  // (incoming_budget.h), into memory mapped as it is written. With limits, a message that does not
  // fit in the buffer waits for its share of the budget (unread), and rejects with DISCONNECTED
  // when its deadline passes first, waiting or not.
  kj::Promise<kj::Maybe<kj::Own<capnp::IncomingRpcMessage>>> readMessage(
      capnp::ReaderOptions options);

  // Queues one message for writing, after every message queued before it. A small message is
  // copied into the batch of this loop turn, written with one write at the end of the turn (or
  // at once when the batch passes BATCH_FLUSH_BYTES), and nullptr is returned. A large one is
  // written from `segments` themselves, which must stay valid until the returned promise
  // settles. A write that fails drops every later message; the connection's reads fail as the
  // socket closes.
  kj::Maybe<kj::Promise<void>> queueMessage(
      kj::ArrayPtr<const kj::ArrayPtr<const capnp::word>> segments);

  kj::Maybe<int> getSendBufferSize();

  // Same host (shared_memory.h): on a unix socket whose peer runs as this process's user, large
  // messages go through shared memory once the peer has said HELLO. `initiate`: say HELLO now
  // (the connecting side); otherwise answer the peer's. Does nothing on any other stream, or
  // over TLS. Call before any message is queued. `log` says, once, why a region could not be
  // made (the message then goes through the socket).
  void useSharedMemory(bool initiate, std::shared_ptr<spdlog::logger> log);

  // Offers the last segment of every incoming message with more than one segment and a last one
  // of at least PLACED_SEGMENT_MIN_BYTES to `placement`, which must outlive the stream.
  void placeSegmentsWith(SegmentPlacement& placement) { this->placement = placement; }

  // Counts every message read and queued from now on into `counters`, which must outlive the
  // stream.
  void countInto(TransportCounters& counters) { this->counters = counters; }

  // Calls `moved` with the bytes of each step (PROGRESS_STEP_BYTES) of a large message read or
  // written from now on, as the step completes, before the message is whole.
  void onLargeMessageProgress(kj::Function<void(size_t bytes)> moved) { progress = kj::mv(moved); }

  // Writes what is queued, then shuts the stream down for writing.
  kj::Promise<void> end();

  // Resolves once every message queued so far has been handed to the socket, or a write
  // failed (nothing more will be written). Hands this turn's batch over now. The stream must
  // outlive the promise.
  kj::Promise<void> whenWritten();

private:
  // Resolves once the buffer holds at least `bytes` unread bytes (reading as needed), or with
  // false at a clean end of stream before any byte of a message.
  kj::Promise<bool> fill(size_t bytes, bool atMessageStart);
  // stream.tryRead(), keeping the descriptors that come with the bytes when shared memory is on.
  kj::Promise<size_t> readSome(kj::byte* into, size_t minBytes, size_t maxBytes);
  kj::Promise<kj::Maybe<kj::Own<capnp::IncomingRpcMessage>>> readHeader(
      capnp::ReaderOptions options);
  kj::Promise<kj::Maybe<kj::Own<capnp::IncomingRpcMessage>>> readBody(capnp::ReaderOptions options,
                                                                      uint32_t segmentCount,
                                                                      size_t tableBytes);
  // The body of a message that must hold part of the server's budget while it arrives: once
  // some of it has come, with what the budget grants it.
  kj::Promise<kj::Maybe<kj::Own<capnp::IncomingRpcMessage>>> readClaimed(
      capnp::ReaderOptions options, uint32_t segmentCount, size_t tableBytes, uint64_t totalWords);
  // The body of a message whose segment table is at the start of the buffer. `claim`: its share
  // of the budget, which every byte read must have been granted; null when unbounded.
  kj::Promise<kj::Maybe<kj::Own<capnp::IncomingRpcMessage>>> readSegments(
      capnp::ReaderOptions options, uint32_t segmentCount, size_t tableBytes, uint64_t totalWords,
      kj::Maybe<IncomingBudget::Claim&> claim);
  // The same for a message whose last segment is offered to `placement`: the others first.
  kj::Promise<kj::Maybe<kj::Own<capnp::IncomingRpcMessage>>> readPlaced(
      capnp::ReaderOptions options, uint32_t segmentCount, size_t tableBytes, uint64_t totalWords,
      size_t lastWords, kj::Maybe<IncomingBudget::Claim&> claim);
  // `into`: what the buffer holds of it first, then the rest from the socket (readRest()).
  kj::Promise<void> readInto(kj::ArrayPtr<kj::byte> into, kj::Maybe<IncomingBudget::Claim&> claim);
  // `into`, all of it from the socket, step by step (PROGRESS_STEP_BYTES, and no more at a time
  // than `claim` has been granted); rejects with DISCONNECTED when the stream ends first.
  kj::Promise<void> readRest(kj::ArrayPtr<kj::byte> into, kj::Maybe<IncomingBudget::Claim&> claim);
  // Copies what the buffer holds of `into` there; returns how much.
  size_t takeBuffered(kj::ArrayPtr<kj::byte> into, kj::Maybe<IncomingBudget::Claim&> claim);
  // Resolves once `claim` has been granted more (Claim::more()), noting meanwhile that the
  // message waits for the budget.
  kj::Promise<void> moreBudget(IncomingBudget::Claim& claim);
  // Writes a large message, table first, from `segments`, step by step.
  struct LargeWrite;
  kj::Promise<void> writeLarge(kj::ArrayPtr<const kj::ArrayPtr<const capnp::word>> segments);
  kj::Promise<void> writeSteps(LargeWrite& write);
  void moved(size_t bytes);
  // A whole message read: the next one has no deadline until it begins. `placed` is its last
  // segment's memory when that is not in `words`; `placedIsOurs` when it came from
  // takeMessageBuffer() rather than from the SegmentPlacement.
  kj::Maybe<kj::Own<capnp::IncomingRpcMessage>> complete(
      kj::Array<capnp::word> words, kj::Array<kj::ArrayPtr<const capnp::word>> segments,
      capnp::ReaderOptions options, kj::Array<capnp::word> placed = nullptr,
      bool placedIsOurs = false);

  // A message's first bytes are in: its deadline starts.
  void messageBegan();
  // `promise`, rejected (closing the connection, logged) if it has not settled by the current
  // message's deadline; as it is when no limits or deadline apply.
  template <typename T>
  kj::Promise<T> bounded(kj::Promise<T> promise);
  kj::Exception timedOut();

  // Shared memory (shared_memory.h). What the stream and the messages it received in shared
  // memory share: a message can outlive the stream (it then releases nothing: the region goes
  // with the connection).
  struct Shared final : public kj::Refcounted {
    BoundedMessageStream* stream = nullptr;  // null once the stream is gone
    OutgoingRegions out;
    IncomingRegions in;
    std::deque<kj::AutoCloseFd> fds;  // received, waiting for their REGION frames
    // What one read brings: a REGION frame carries one; the kernel gives no more than one
    // frame's with a read, and this closes any beyond the room.
    kj::AutoCloseFd readFds[4];
    std::shared_ptr<spdlog::logger> log;
  };
  class SharedMessage;
  kj::Promise<kj::Maybe<kj::Own<capnp::IncomingRpcMessage>>> readControl(
      capnp::ReaderOptions options);
  kj::Promise<kj::Maybe<kj::Own<capnp::IncomingRpcMessage>>> takeControl(
      capnp::ReaderOptions options);
  kj::Own<capnp::IncomingRpcMessage> receiveShared(const ControlFrame& frame,
                                                   capnp::ReaderOptions options);
  // Puts the message through shared memory; false when it must go through the socket.
  bool sendShared(kj::ArrayPtr<const kj::ArrayPtr<const capnp::word>> segments, size_t bytes);
  void queueControl(ControlKind kind, uint32_t region = 0, uint64_t a = 0, uint64_t b = 0);
  void sendForgotten();

  // The batch is flushed at the end of this turn, or now when it is large.
  void scheduleFlush();
  // Hands the batch to the stream after every earlier write; returns the latest write.
  kj::Promise<void> flush();
  kj::Promise<void> afterWrites();
  kj::Promise<void> track(kj::Promise<void> write);

  kj::AsyncIoStream& stream;
  const uint64_t maxMessageBytes;
  // Set by useSharedMemory() on a stream that can carry descriptors; null otherwise.
  kj::AsyncCapabilityStream* fdStream = nullptr;
  kj::Own<Shared> shared;
  bool offered = false;     // this side said HELLO
  bool peerShares = false;  // the peer said HELLO
  kj::Maybe<ReadLimits> limits;
  kj::Maybe<TransportCounters&> counters;
  kj::Maybe<SegmentPlacement&> placement;
  kj::Maybe<kj::Function<void(size_t)>> progress;
  kj::Maybe<kj::TimePoint> deadline;  // of the message being read, or of the first one
  bool deadlineIsFirst = true;        // the deadline is the first message's
  bool firstMessageRead = false;
  // The message being read, for the log line of a timeout: its size once its segment table is
  // in, the bytes of its body read into its memory, and whether it waits for the budget now.
  uint64_t announced = 0;
  uint64_t arrived = 0;
  bool waitingForBudget = false;

  kj::Array<kj::byte> readBuffer;
  size_t readBegin = 0;  // unread bytes are [readBegin, readEnd)
  size_t readEnd = 0;

  int socketFd = -1;                  // the stream's socket, written directly when idle
  kj::Vector<kj::byte> batch;         // framed messages not yet handed to the stream
  kj::ForkedPromise<void> lastWrite;  // the latest write handed to the stream
  size_t writesInFlight = 0;
  kj::Maybe<kj::Exception> writeFailure;
  bool flushQueued = false;
  kj::Promise<void> flushLater = nullptr;  // the end-of-turn flush
};

}  // namespace troupe::net_detail
