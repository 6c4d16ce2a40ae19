// BoundedMessageStream's same-host half: large messages through shared memory
// (shared_memory.h).

#include <sys/socket.h>
#include <unistd.h>

#include <deque>

#include <kj/debug.h>
#include <spdlog/spdlog.h>

#include "troupe/base/errors.h"
#include "troupe/net/detail/framing.h"
#include "troupe/net/detail/message_stream.h"
#include "troupe/net/detail/received_words.h"
#include "troupe/net/limits.h"
#include "troupe/net/same_host.h"

namespace troupe::net_detail {

namespace {

// Descriptors received and not yet claimed by their REGION frame, at most: a peer that sends
// descriptors with no frames for them is cut off.
constexpr size_t MAX_UNCLAIMED_FDS = 16;

kj::Exception protocolError(kj::StringPtr what) {
  return makeError(ErrorCode::FAILED, kj::str("same-host connection: ", what));
}

}  // namespace

// A message read where the peer put it, in one of its regions. Its words are a ReceivedWords,
// so that keepReceivedBytes() (bytes.h) finds them: whoever keeps some then holds the mapping,
// and the region is retired rather than used for the sender's next message.
class BoundedMessageStream::SharedMessage final : public capnp::MessageReader,
                                                  public capnp::IncomingRpcMessage {
public:
  SharedMessage(kj::Own<const MappedRegion> region, kj::ArrayPtr<const capnp::word> body,
                kj::Array<kj::ArrayPtr<const capnp::word>> table, capnp::ReaderOptions options,
                kj::Own<Shared> shared, uint32_t id)
      : capnp::MessageReader(options),
        words(kj::atomicRefcounted<ReceivedWords>(
            kj::ArrayPtr<capnp::word>(const_cast<capnp::word*>(body.begin()), body.size())
                .attach(kj::mv(region)))),
        table(kj::mv(table)),
        shared(kj::mv(shared)),
        id(id) {}

  ~SharedMessage() noexcept(false) {
    // Whether anyone kept bytes of it (and may have written them, or may still hold them);
    // if no one did, no one can from here on.
    bool kept = words->keptElseHide() || words->isShared();
    words = nullptr;
    auto* stream = shared->stream;
    if (stream == nullptr) return;  // the region goes with the connection
    if (kept) {
      // Someone holds bytes of it: the sender must never write there again.
      shared->in.forget(id);
      stream->queueControl(ControlKind::KEPT, id);
    } else {
      // The region carries the sender's next message once it hears this.
      stream->queueControl(ControlKind::RELEASE, id);
    }
  }

  kj::ArrayPtr<const capnp::word> getSegment(uint id) override {
    return id < table.size() ? table[id] : nullptr;
  }
  capnp::AnyPointer::Reader getBody() override { return getRoot<capnp::AnyPointer>(); }
  size_t sizeInWords() override { return words->get().size(); }

private:
  kj::Own<const ReceivedWords> words;                // the segments, in the region
  kj::Array<kj::ArrayPtr<const capnp::word>> table;  // into `words`
  kj::Own<Shared> shared;
  uint32_t id;
};

BoundedMessageStream::~BoundedMessageStream() noexcept(false) {
  if (shared.get() != nullptr) shared->stream = nullptr;
}

void BoundedMessageStream::useSharedMemory(bool initiate, std::shared_ptr<spdlog::logger> log) {
  if (socketFd < 0 || sameUserUnixPeer(socketFd) == nullptr) return;
  fdStream = dynamic_cast<kj::AsyncCapabilityStream*>(&stream);
  if (fdStream == nullptr) return;
  shared = kj::refcounted<Shared>();
  shared->stream = this;
  shared->log = kj::mv(log);
  if (initiate) {
    offered = true;
    queueControl(ControlKind::HELLO);
  }
}

kj::Promise<size_t> BoundedMessageStream::readSome(kj::byte* into, size_t minBytes,
                                                   size_t maxBytes) {
  if (fdStream == nullptr) return stream.tryRead(into, minBytes, maxBytes);
  // One read at a time: the stream's own buffer takes the descriptors.
  auto& fds = shared->readFds;
  return fdStream->tryReadWithFds(into, minBytes, maxBytes, fds, kj::size(fds))
      .then([this](kj::AsyncCapabilityStream::ReadResult r) {
        auto& fds = shared->readFds;
        for (size_t i = 0; i < r.capCount; ++i) shared->fds.push_back(kj::mv(fds[i]));
        if (shared->fds.size() > MAX_UNCLAIMED_FDS) {
          kj::throwFatalException(protocolError("descriptors sent with no region for them"));
        }
        return r.byteCount;
      });
}

kj::Promise<kj::Maybe<kj::Own<capnp::IncomingRpcMessage>>> BoundedMessageStream::readControl(
    capnp::ReaderOptions options) {
  if (readEnd - readBegin >= sizeof(ControlFrame)) return takeControl(options);
  return bounded(fill(sizeof(ControlFrame), false)).then([this, options](bool) {
    return takeControl(options);
  });
}

kj::Promise<kj::Maybe<kj::Own<capnp::IncomingRpcMessage>>> BoundedMessageStream::takeControl(
    capnp::ReaderOptions options) {
  using Result = kj::Maybe<kj::Own<capnp::IncomingRpcMessage>>;
  ControlFrame frame;
  memcpy(&frame, readBuffer.begin() + readBegin, sizeof(frame));
  readBegin += sizeof(frame);
  if (readBegin == readEnd) readBegin = readEnd = 0;

  switch (frame.kind) {
    case ControlKind::HELLO:
      if (!offered) {
        offered = true;
        queueControl(ControlKind::HELLO);
      }
      peerShares = true;
      break;
    case ControlKind::REGION: {
      if (shared->fds.empty()) return protocolError("a region announced without its descriptor");
      auto fd = kj::mv(shared->fds.front());
      shared->fds.pop_front();
      shared->in.add(frame.region, kj::mv(fd), frame.a);
      break;
    }
    case ControlKind::MESSAGE:
      return Result(receiveShared(frame, options));
    case ControlKind::RELEASE:
      shared->out.release(frame.region);
      sendForgotten();
      break;
    case ControlKind::FORGET:
      shared->in.forget(frame.region);
      break;
    case ControlKind::KEPT:
      shared->out.retire(frame.region);
      break;
    default:
      return protocolError(kj::str("unknown control frame ", static_cast<uint32_t>(frame.kind)));
  }
  // Not a message: the deadline goes back to what it was between messages.
  announced = 0;
  if (firstMessageRead) {
    deadline = nullptr;
  } else {
    KJ_IF_MAYBE(l, limits) {
      deadline = l->firstMessageBy;
      deadlineIsFirst = true;
    }
  }
  return readMessage(options);
}

kj::Own<capnp::IncomingRpcMessage> BoundedMessageStream::receiveShared(
    const ControlFrame& frame, capnp::ReaderOptions options) {
  if (frame.a % sizeof(capnp::word) != 0 || frame.b < sizeof(capnp::word)) {
    kj::throwFatalException(protocolError("a misaligned message in shared memory"));
  }
  auto region = shared->in.at(frame.region, frame.a, frame.b);
  const kj::byte* at = region->map + frame.a;
  // The table is read once, into memory of this side's own: what the peer writes there later
  // cannot change the bounds the reader checks against.
  uint32_t segmentCount = readLe32(at) + 1;
  if (segmentCount == 0 || segmentCount > MAX_SEGMENTS) {
    kj::throwFatalException(protocolError("a message in shared memory with a bad segment count"));
  }
  size_t table = tableBytes(segmentCount);
  if (table > frame.b) kj::throwFatalException(protocolError("a truncated segment table"));
  uint64_t words = announcedWords(at, segmentCount);
  if (words > (frame.b - table) / sizeof(capnp::word)) {
    kj::throwFatalException(protocolError("a message larger than its place in shared memory"));
  }
  auto body = kj::arrayPtr(reinterpret_cast<const capnp::word*>(at + table), words);
  auto segments = kj::heapArray<kj::ArrayPtr<const capnp::word>>(segmentCount);
  sliceSegments(at, body, segments);
  uint64_t bytes = words * sizeof(capnp::word);
  if (bytes > maxMessageBytes) kj::throwFatalException(incomingTooLarge(bytes, maxMessageBytes));

  firstMessageRead = true;
  deadline = nullptr;
  announced = 0;
  moved(bytes + table);
  KJ_IF_MAYBE(c, counters) {
    c->received(bytes + table);
    ++c->sharedMessagesReceived;
  }
  capnp::ReaderOptions generous = options;
  generous.traversalLimitInWords = options.traversalLimitInWords * TRAVERSAL_FACTOR;
  return kj::heap<SharedMessage>(kj::mv(region), body, kj::mv(segments), generous,
                                 kj::addRef(*shared), frame.region);
}

bool BoundedMessageStream::sendShared(kj::ArrayPtr<const kj::ArrayPtr<const capnp::word>> segments,
                                      size_t bytes) {
  auto& s = *shared;
  KJ_IF_MAYBE(slot, s.out.take(bytes)) {
    writeFramed(slot->memory.begin(), segments);
    sendForgotten();
    if (slot->newFd.get() >= 0) {
      // The descriptor rides on the REGION frame's bytes, after everything queued before it.
      flush();
      ControlFrame frame{ControlKind::REGION, slot->region, slot->regionBytes};
      auto bytesOut = kj::heapArray<kj::byte>(sizeof(frame));
      memcpy(bytesOut.begin(), &frame, sizeof(frame));
      // The write owns the descriptor, and closes it once written: the region lives on in the
      // mappings.
      auto fds = kj::heapArray<int>({slot->newFd.get()});
      track(afterWrites().then([this, bytesOut = kj::mv(bytesOut), fds = kj::mv(fds),
                                fd = kj::mv(slot->newFd)]() mutable {
        auto write = fdStream->writeWithFds(bytesOut, nullptr, fds);
        return write.attach(kj::mv(bytesOut), kj::mv(fds), kj::mv(fd));
      }));
    }
    queueControl(ControlKind::MESSAGE, slot->region, 0, bytes);
    moved(bytes);
    return true;
  }
  sendForgotten();  // regions closed to make room for one that could not be made
  KJ_IF_MAYBE(why, s.out.takeFailure()) {
    if (s.log != nullptr) {
      s.log->warn("same-host connection: cannot make shared memory ({}); large messages go "
                  "through the socket",
                  why->cStr());
    }
  }
  return false;
}

void BoundedMessageStream::queueControl(ControlKind kind, uint32_t region, uint64_t a, uint64_t b) {
  if (writeFailure != nullptr) return;
  ControlFrame frame{kind, region, a, b};
  size_t at = batch.size();
  batch.resize(at + sizeof(frame));
  memcpy(batch.begin() + at, &frame, sizeof(frame));
  scheduleFlush();
}

void BoundedMessageStream::sendForgotten() {
  for (auto id : shared->out.takeClosed()) queueControl(ControlKind::FORGET, id);
}

}  // namespace troupe::net_detail
