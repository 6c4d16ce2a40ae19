#include "troupe/net/detail/message_stream.h"

#include <errno.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>

#include <algorithm>
#include <new>

#include <kj/debug.h>
#include <spdlog/spdlog.h>

#include "troupe/base/buffer_cache.h"
#include "troupe/base/errors.h"
#include "troupe/net/bytes.h"
#include "troupe/net/detail/framing.h"
#include "troupe/net/detail/received_words.h"
#include "troupe/net/limits.h"

namespace troupe::net_detail {

namespace {

// Memory a received message was read into: when it is troupe's own and large, shared with
// whoever keeps a Data value in it (keepReceivedBytes(), bytes.h).
class MessageMemory {
public:
  MessageMemory() = default;
  MessageMemory(kj::Array<capnp::word> words, bool shareable) {
    if (shareable && words.size() * sizeof(capnp::word) >= KEPT_RECEIVED_MIN_BYTES) {
      shared = kj::atomicRefcounted<ReceivedWords>(kj::mv(words));
      view = shared->get();
    } else {
      own = kj::mv(words);
      view = own;
    }
  }

  kj::ArrayPtr<const capnp::word> get() const { return view; }

private:
  kj::Array<capnp::word> own;
  kj::Own<const ReceivedWords> shared;
  kj::ArrayPtr<const capnp::word> view;  // whichever holds it
};

// A message read from the stream, in the form Cap'n Proto's RPC system receives it: owns its
// memory and, when it has more than one segment, the table pointing into it.
class ReceivedMessage final : public capnp::MessageReader, public capnp::IncomingRpcMessage {
public:
  ReceivedMessage(MessageMemory words, kj::Array<kj::ArrayPtr<const capnp::word>> table,
                  capnp::ReaderOptions options, MessageMemory placed)
      : capnp::MessageReader(options),
        words(kj::mv(words)),
        table(kj::mv(table)),
        placed(kj::mv(placed)) {}

  kj::ArrayPtr<const capnp::word> getSegment(uint id) override {
    if (table == nullptr) return id == 0 ? words.get() : nullptr;
    return id < table.size() ? table[id] : nullptr;
  }

  capnp::AnyPointer::Reader getBody() override { return getRoot<capnp::AnyPointer>(); }
  size_t sizeInWords() override { return words.get().size() + placed.get().size(); }

private:
  MessageMemory words;
  kj::Array<kj::ArrayPtr<const capnp::word>> table;  // null for a single segment
  MessageMemory placed;  // the last segment, when it was read apart (readPlaced())
};

uint64_t millis(kj::Duration d) { return d / kj::MILLISECONDS; }

// Unmaps what untouchedMemory() mapped.
class UnmappingDisposer final : public kj::ArrayDisposer {
  void disposeImpl(void* first, size_t elementSize, size_t count, size_t,
                   void (*)(void*)) const override {
    munmap(first, elementSize * count);
  }
};

const UnmappingDisposer unmappingDisposer;

// `words` words that cost no memory until written: the kernel maps each page as it is first
// touched (and, MAP_NORESERVE, charges nothing for the rest), so a message read in steps holds
// in memory what has arrived of it, as the budget counts. Throws std::bad_alloc as `new` does.
kj::Array<capnp::word> untouchedMemory(size_t words) {
  void* p = mmap(nullptr, words * sizeof(capnp::word), PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) throw std::bad_alloc();
  return kj::Array<capnp::word>(static_cast<capnp::word*>(p), words, unmappingDisposer);
}

// Memory for `words` words of a message: the thread's buffer cache (buffer_cache.h), unless the
// message is read in steps (its claim was not granted whole) and this is more than a step.
kj::Array<capnp::word> bodyMemory(size_t words, kj::Maybe<IncomingBudget::Claim&> claim) {
  KJ_IF_MAYBE(c, claim) {
    if (!c->whole() && words * sizeof(capnp::word) > BUDGET_STEP_BYTES) {
      return untouchedMemory(words);
    }
  }
  return takeMessageBuffer(words);
}

}  // namespace

// A large message being written: its table, and where the next step starts.
struct BoundedMessageStream::LargeWrite {
  kj::Array<kj::byte> table;
  kj::Array<kj::ArrayPtr<const kj::byte>> pieces;  // the table, then each segment
  size_t piece = 0;
  size_t offset = 0;                              // into pieces[piece]
  kj::Vector<kj::ArrayPtr<const kj::byte>> step;  // what the write in flight writes
};

// ------------------------------------------------------------------------------------------------

BoundedMessageStream::BoundedMessageStream(kj::AsyncIoStream& stream, uint64_t maxMessageBytes,
                                           bool direct, kj::Maybe<ReadLimits> limits)
    : stream(stream),
      maxMessageBytes(maxMessageBytes),
      limits(kj::mv(limits)),
      readBuffer(kj::heapArray<kj::byte>(READ_BUFFER_BYTES)),
      lastWrite(kj::Promise<void>(kj::READY_NOW).fork()) {
  KJ_IF_MAYBE(l, this->limits) {
    deadline = l->firstMessageBy;
  }
  // A TLS stream reports the socket under it as its fd: writing there would skip the encryption.
  if (!direct) return;
  KJ_IF_MAYBE(fd, stream.getFd()) {
    int type;
    socklen_t len = sizeof(type);
    if (::getsockopt(*fd, SOL_SOCKET, SO_TYPE, &type, &len) == 0) socketFd = *fd;
  }
}

// ------------------------------------------------------------------------------------------------
// Reading

kj::Promise<bool> BoundedMessageStream::fill(size_t bytes, bool atMessageStart) {
  KJ_ASSERT(bytes <= readBuffer.size());
  if (readEnd - readBegin >= bytes) return true;
  if (readBuffer.size() - readBegin < bytes) {
    memmove(readBuffer.begin(), readBuffer.begin() + readBegin, readEnd - readBegin);
    readEnd -= readBegin;
    readBegin = 0;
  }
  size_t have = readEnd - readBegin;
  return readSome(readBuffer.begin() + readEnd, bytes - have, readBuffer.size() - readEnd)
      .then([this, bytes, atMessageStart](size_t n) -> kj::Promise<bool> {
        readEnd += n;
        if (readEnd - readBegin >= bytes) return true;
        if (readEnd == readBegin && atMessageStart) return false;  // a clean end of stream
        return KJ_EXCEPTION(DISCONNECTED, "connection closed in the middle of a message");
      });
}

void BoundedMessageStream::messageBegan() {
  announced = 0;
  arrived = 0;
  KJ_IF_MAYBE(l, limits) {
    auto end = l->timer.now() + l->messageTimeout;
    // Before the first whole message, whichever deadline comes first.
    if (!firstMessageRead && l->firstMessageBy <= end) return;
    deadline = end;
    deadlineIsFirst = false;
  }
}

template <typename T>
kj::Promise<T> BoundedMessageStream::bounded(kj::Promise<T> promise) {
  KJ_IF_MAYBE(l, limits) {
    KJ_IF_MAYBE(d, deadline) {
      // Thrown, not returned as a promise: a promise would settle a turn later, when the other
      // branch (a grant of the budget, say) may have won, after timedOut() had logged anyway.
      return promise.exclusiveJoin(
          l->timer.atTime(*d).then([this]() -> T { kj::throwFatalException(timedOut()); }));
    }
  }
  return promise;
}

kj::Exception BoundedMessageStream::timedOut() {
  auto& l = KJ_ASSERT_NONNULL(limits);
  auto why = deadlineIsFirst
                 ? kj::str("no whole message arrived within ", millis(l.firstMessageTimeout),
                           " ms of connecting (ConnectionLimits::firstMessageTimeout)")
                 : kj::str("a message was still incomplete ", millis(l.messageTimeout),
                           " ms after it began (ConnectionLimits::messageTimeout)");
  ++(deadlineIsFirst ? l.timeouts.firstMessage : l.timeouts.message);
  // What it was doing: a peer that announced a message and sent nothing, one that stalled
  // partway, or one whose turn in the budget had not come (its wait counts).
  auto doing = announced == 0
                   ? kj::str()
                   : kj::str(", with ", arrived, " of the ", announced, " bytes of a message in",
                             waitingForBudget ? ", waiting for its share of the budget for "
                                                "incomplete messages"
                                              : "");
  l.log->warn("{}: {}{}; closing it", l.peer, why.cStr(), doing.cStr());
  return makeError(ErrorCode::DISCONNECTED, kj::str(why, doing, "; closing the connection"));
}

kj::Promise<kj::Maybe<kj::Own<capnp::IncomingRpcMessage>>> BoundedMessageStream::readMessage(
    capnp::ReaderOptions options) {
  using Result = kj::Maybe<kj::Own<capnp::IncomingRpcMessage>>;
  if (readEnd - readBegin >= sizeof(capnp::word)) {
    // The buffer holds the next message's header already (one read often brings several small
    // messages): no promise chain unless something is missing.
    messageBegan();
    return readHeader(options);
  }
  // Between messages only the first-message deadline applies; a message's own starts with its
  // first byte, so a sender trickling its header is bounded too.
  auto first = readEnd > readBegin ? kj::Promise<bool>(true) : bounded(fill(1, true));
  return first.then([this, options](bool more) -> kj::Promise<Result> {
    if (!more) return Result(nullptr);
    messageBegan();
    if (readEnd - readBegin >= sizeof(capnp::word)) return readHeader(options);
    return bounded(fill(sizeof(capnp::word), false)).then([this, options](bool) {
      return readHeader(options);
    });
  });
}

kj::Promise<kj::Maybe<kj::Own<capnp::IncomingRpcMessage>>> BoundedMessageStream::readHeader(
    capnp::ReaderOptions options) {
  uint32_t segmentCount = readLe32(readBuffer.begin() + readBegin) + 1;  // 0 on overflow
  if (segmentCount == 0 && shared.get() != nullptr) return readControl(options);
  if (segmentCount == 0 || segmentCount > MAX_SEGMENTS) {
    return KJ_EXCEPTION(FAILED, "malformed message: bad segment count", segmentCount - 1);
  }
  size_t table = tableBytes(segmentCount);
  if (readEnd - readBegin >= table) return readBody(options, segmentCount, table);
  return bounded(fill(table, false)).then([this, options, segmentCount, table](bool) {
    return readBody(options, segmentCount, table);
  });
}

kj::Promise<kj::Maybe<kj::Own<capnp::IncomingRpcMessage>>> BoundedMessageStream::readBody(
    capnp::ReaderOptions options, uint32_t segmentCount, size_t table) {
  uint64_t words = announcedWords(readBuffer.begin() + readBegin, segmentCount);
  uint64_t totalBytes = words * sizeof(capnp::word);
  if (totalBytes > maxMessageBytes) {
    return incomingTooLarge(totalBytes, maxMessageBytes);
  }
  announced = totalBytes;
  bool whole = readEnd - readBegin - table >= totalBytes;
  if (whole || limits == nullptr) {
    return readSegments(options, segmentCount, table, words, nullptr);
  }
  // Its memory stays taken until the rest arrives: it must have its share of the server's budget.
  return readClaimed(options, segmentCount, table, words);
}

kj::Promise<kj::Maybe<kj::Own<capnp::IncomingRpcMessage>>> BoundedMessageStream::readClaimed(
    capnp::ReaderOptions options, uint32_t segmentCount, size_t table, uint64_t totalWords) {
  auto& l = KJ_ASSERT_NONNULL(limits);
  if (readEnd - readBegin == table) {
    // Nothing of its body yet: it takes nothing of the budget until some comes, so a peer that
    // announces a message and sends nothing holds nothing. Its deadline runs meanwhile.
    return bounded(fill(table + 1, false)).then([this, options, segmentCount, table](bool) {
      return readBody(options, segmentCount, table);
    });
  }
  uint64_t totalBytes = totalWords * sizeof(capnp::word);
  auto claim = l.budget.claim(totalBytes, l.peerHost);
  auto& c = *claim;
  // Nothing is read while it waits, so the segment table waits in the buffer; the wait counts
  // against its deadline.
  auto granted = moreBudget(c);
  if (waitingForBudget) {
    l.log->info("{}: a message of {} bytes waits: incomplete messages hold {} bytes of the "
                "server's budget (ConnectionLimits::maxIncompleteMessageBytes)",
                l.peer, totalBytes, l.budget.held());
  }
  return bounded(kj::mv(granted))
      .then([this, options, segmentCount, table, totalWords, &c]() {
        return readSegments(options, segmentCount, table, totalWords, c);
      })
      .attach(kj::mv(claim));
}

kj::Promise<void> BoundedMessageStream::moreBudget(IncomingBudget::Claim& claim) {
  auto granted = claim.more();
  if (claim.unused() > 0) return granted;
  waitingForBudget = true;
  return granted.then([this]() {
    // Granted as its deadline passed (the budget freed by peers closed at the same deadline,
    // say): too late, and the bytes go back at once.
    KJ_IF_MAYBE(l, limits) {
      KJ_IF_MAYBE(d, deadline) {
        if (l->timer.now() >= *d) kj::throwFatalException(timedOut());
      }
    }
    waitingForBudget = false;
  });
}

kj::Promise<kj::Maybe<kj::Own<capnp::IncomingRpcMessage>>> BoundedMessageStream::readSegments(
    capnp::ReaderOptions options, uint32_t segmentCount, size_t table, uint64_t totalWords,
    kj::Maybe<IncomingBudget::Claim&> claim) {
  const kj::byte* tableAt = readBuffer.begin() + readBegin;
  if (placement != nullptr && segmentCount > 1) {
    size_t lastWords = segmentWords(tableAt, segmentCount - 1);
    if (lastWords * sizeof(capnp::word) >= PLACED_SEGMENT_MIN_BYTES) {
      return readPlaced(options, segmentCount, table, totalWords, lastWords, claim);
    }
  }
  auto words = bodyMemory(totalWords, claim);
  kj::Array<kj::ArrayPtr<const capnp::word>> segments;
  if (segmentCount > 1) {
    segments = kj::heapArray<kj::ArrayPtr<const capnp::word>>(segmentCount);
    sliceSegments(tableAt, words, segments);
  }
  readBegin += table;

  // What the buffer already holds of the body, then the rest straight from the socket.
  auto body = words.asBytes();
  size_t buffered = takeBuffered(body, claim);
  if (buffered == body.size()) return complete(kj::mv(words), kj::mv(segments), options);
  auto read = bounded(readRest(body.slice(buffered, body.size()), claim));
  return read.then([this, options, words = kj::mv(words), segments = kj::mv(segments)]() mutable {
    return complete(kj::mv(words), kj::mv(segments), options);
  });
}

kj::Promise<kj::Maybe<kj::Own<capnp::IncomingRpcMessage>>> BoundedMessageStream::readPlaced(
    capnp::ReaderOptions options, uint32_t segmentCount, size_t table, uint64_t totalWords,
    size_t lastWords, kj::Maybe<IncomingBudget::Claim&> claim) {
  auto head = bodyMemory(totalWords - lastWords, claim);
  auto segments = kj::heapArray<kj::ArrayPtr<const capnp::word>>(segmentCount);
  sliceSegments(readBuffer.begin() + readBegin, head, segments.slice(0, segmentCount - 1));
  readBegin += table;
  auto headBytes = head.asBytes();
  auto read = readInto(headBytes, claim);
  return read.then([this, options, lastWords, claim, head = kj::mv(head),
                    segments = kj::mv(segments)]() mutable {
    auto& p = KJ_ASSERT_NONNULL(placement);
    kj::Array<capnp::word> last;
    bool ours = false;  // memory of the message's own, not its placement's
    KJ_IF_MAYBE(placed, p.place(segments.slice(0, segments.size() - 1), lastWords)) {
      last = kj::mv(*placed);
    } else {
      last = bodyMemory(lastWords, claim);
      ours = true;
    }
    segments[segments.size() - 1] = last;
    auto lastBytes = last.asBytes();
    return readInto(lastBytes, claim)
        .then([this, options, head = kj::mv(head), segments = kj::mv(segments), last = kj::mv(last),
               ours]() mutable {
          return complete(kj::mv(head), kj::mv(segments), options, kj::mv(last), ours);
        });
  });
}

size_t BoundedMessageStream::takeBuffered(kj::ArrayPtr<kj::byte> into,
                                          kj::Maybe<IncomingBudget::Claim&> claim) {
  size_t buffered = std::min(readEnd - readBegin, into.size());
  memcpy(into.begin(), readBuffer.begin() + readBegin, buffered);
  readBegin += buffered;
  if (readBegin == readEnd) readBegin = readEnd = 0;
  arrived += buffered;
  KJ_IF_MAYBE(c, claim) {
    c->use(buffered);  // the first grant covers the buffer (BUDGET_STEP_BYTES >= its size)
  }
  return buffered;
}

kj::Promise<void> BoundedMessageStream::readInto(kj::ArrayPtr<kj::byte> into,
                                                 kj::Maybe<IncomingBudget::Claim&> claim) {
  size_t buffered = takeBuffered(into, claim);
  if (buffered == into.size()) return kj::READY_NOW;
  return bounded(readRest(into.slice(buffered, into.size()), claim));
}

kj::Promise<void> BoundedMessageStream::readRest(kj::ArrayPtr<kj::byte> into,
                                                 kj::Maybe<IncomingBudget::Claim&> claim) {
  size_t allowed = into.size();
  KJ_IF_MAYBE(c, claim) {
    if (c->unused() == 0) {
      return moreBudget(*c).then([this, into, claim]() mutable { return readRest(into, claim); });
    }
    allowed = std::min<uint64_t>(allowed, c->unused());
  }
  size_t step = std::min(allowed, PROGRESS_STEP_BYTES);
  return stream.tryRead(into.begin(), step, allowed)
      .then([this, into, step, claim](size_t n) mutable -> kj::Promise<void> {
        moved(n);
        arrived += n;
        KJ_IF_MAYBE(c, claim) {
          c->use(n);
        }
        if (n < step) {
          return KJ_EXCEPTION(DISCONNECTED, "connection closed in the middle of a message");
        }
        if (n == into.size()) return kj::READY_NOW;
        return readRest(into.slice(n, into.size()), claim);
      });
}

void BoundedMessageStream::moved(size_t bytes) {
  KJ_IF_MAYBE(p, progress) {
    (*p)(bytes);
  }
}

kj::Maybe<kj::Own<capnp::IncomingRpcMessage>> BoundedMessageStream::complete(
    kj::Array<capnp::word> words, kj::Array<kj::ArrayPtr<const capnp::word>> segments,
    capnp::ReaderOptions options, kj::Array<capnp::word> placed, bool placedIsOurs) {
  firstMessageRead = true;
  deadline = nullptr;
  announced = 0;
  KJ_IF_MAYBE(c, counters) {
    c->received((words.size() + placed.size()) * sizeof(capnp::word) + tableBytes(segments.size()));
  }
  capnp::ReaderOptions generous = options;
  generous.traversalLimitInWords = options.traversalLimitInWords * TRAVERSAL_FACTOR;
  return kj::Maybe<kj::Own<capnp::IncomingRpcMessage>>(
      kj::heap<ReceivedMessage>(MessageMemory(kj::mv(words), true), kj::mv(segments), generous,
                                MessageMemory(kj::mv(placed), placedIsOurs)));
}

// ------------------------------------------------------------------------------------------------
// Writing

kj::Promise<void> BoundedMessageStream::afterWrites() { return lastWrite.addBranch(); }

kj::Promise<void> BoundedMessageStream::track(kj::Promise<void> write) {
  ++writesInFlight;
  auto done = write.then(
      [this]() -> kj::Promise<void> {
        --writesInFlight;
        return kj::READY_NOW;
      },
      [this](kj::Exception&& e) -> kj::Promise<void> {
        --writesInFlight;
        if (writeFailure == nullptr) writeFailure = kj::cp(e);
        return kj::mv(e);
      });
  lastWrite = done.fork();
  return lastWrite.addBranch();
}

kj::Promise<void> BoundedMessageStream::flush() {
  if (batch.empty()) return afterWrites();
  size_t sent = 0;
  if (socketFd >= 0 && writesInFlight == 0 && writeFailure == nullptr) {
    // Nothing in flight: hand the batch to the socket now, with no promise to settle; only what
    // the socket cannot take yet waits for it.
    for (;;) {
      ssize_t n = ::send(socketFd, batch.begin() + sent, batch.size() - sent,
                         MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n >= 0) {
        sent += n;
        if (sent < batch.size()) continue;
        batch.clear();
        if (batch.capacity() > KEPT_BATCH_CAPACITY) batch = kj::Vector<kj::byte>();
        return kj::READY_NOW;
      }
      int error = errno;
      if (error == EINTR) continue;
      if (error == EAGAIN || error == EWOULDBLOCK) break;
      auto failure = syscallException("send", error);
      writeFailure = kj::cp(failure);
      batch.clear();
      return kj::mv(failure);
    }
  }
  auto bytes = batch.releaseAsArray();
  return track(afterWrites().then([this, bytes = kj::mv(bytes), sent]() mutable {
    auto write = stream.write(bytes.begin() + sent, bytes.size() - sent);
    return write.attach(kj::mv(bytes));
  }));
}

kj::Maybe<kj::Promise<void>> BoundedMessageStream::queueMessage(
    kj::ArrayPtr<const kj::ArrayPtr<const capnp::word>> segments) {
  if (writeFailure != nullptr) return nullptr;  // the connection is going down with its reads
  KJ_REQUIRE(segments.size() > 0 && segments.size() <= MAX_SEGMENTS, "bad outgoing message",
             segments.size());
  size_t table = tableBytes(segments.size());
  size_t bytes = table;
  for (auto& s : segments) bytes += s.asBytes().size();
  KJ_IF_MAYBE(c, counters) {
    c->sent(bytes);
  }

  if (peerShares && bytes >= SHARED_MIN_MESSAGE_BYTES && sendShared(segments, bytes)) {
    KJ_IF_MAYBE(c, counters) {
      ++c->sharedMessagesSent;
    }
    return nullptr;
  }

  if (bytes > COALESCE_MAX_MESSAGE_BYTES) {
    // Large: after the batch, from the message's own segments.
    flush();
    return track(afterWrites().then([this, segments]() { return writeLarge(segments); }));
  }

  size_t at = batch.size();
  batch.resize(at + bytes);
  writeFramed(batch.begin() + at, segments);
  scheduleFlush();
  return nullptr;
}

void BoundedMessageStream::scheduleFlush() {
  if (batch.size() >= BATCH_FLUSH_BYTES) {
    flush();
  } else if (!flushQueued) {
    // Everything sent in this turn of the loop leaves in one write at its end.
    flushQueued = true;
    flushLater = kj::evalLater([this]() {
                   flushQueued = false;
                   flush();
                 }).eagerlyEvaluate(nullptr);
  }
}

kj::Promise<void> BoundedMessageStream::writeLarge(
    kj::ArrayPtr<const kj::ArrayPtr<const capnp::word>> segments) {
  auto w = kj::heap<LargeWrite>();
  w->table = kj::heapArray<kj::byte>(tableBytes(segments.size()));
  writeTable(w->table.begin(), segments);
  auto pieces = kj::heapArrayBuilder<kj::ArrayPtr<const kj::byte>>(segments.size() + 1);
  pieces.add(w->table);
  for (auto& s : segments) pieces.add(s.asBytes());
  w->pieces = pieces.finish();
  auto& write = *w;
  return writeSteps(write).attach(kj::mv(w));
}

kj::Promise<void> BoundedMessageStream::writeSteps(LargeWrite& w) {
  // The next PROGRESS_STEP_BYTES, across pieces: one write with as few system calls as before.
  w.step.clear();
  size_t bytes = 0;
  while (w.piece < w.pieces.size() && bytes < PROGRESS_STEP_BYTES) {
    auto piece = w.pieces[w.piece];
    size_t take = std::min(piece.size() - w.offset, PROGRESS_STEP_BYTES - bytes);
    if (take > 0) w.step.add(piece.slice(w.offset, w.offset + take));
    bytes += take;
    w.offset += take;
    if (w.offset == piece.size()) {
      ++w.piece;
      w.offset = 0;
    }
  }
  if (w.step.empty()) return kj::READY_NOW;
  return stream.write(w.step.asPtr()).then([this, &w, bytes]() {
    moved(bytes);
    return writeSteps(w);
  });
}

kj::Maybe<int> BoundedMessageStream::getSendBufferSize() {
  int size = 0;
  uint len = sizeof(size);
  KJ_IF_MAYBE(e, kj::runCatchingExceptions(
                     [&]() { stream.getsockopt(SOL_SOCKET, SO_SNDBUF, &size, &len); })) {
    (void)e;
    return nullptr;
  }
  return size;
}

kj::Promise<void> BoundedMessageStream::whenWritten() {
  return flush().catch_([](kj::Exception&&) {});
}

kj::Promise<void> BoundedMessageStream::end() {
  return flush().then([this]() { stream.shutdownWrite(); });
}

}  // namespace troupe::net_detail
