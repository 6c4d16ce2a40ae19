#include "actor/detail/message_stream.h"

#include <sys/socket.h>

#include <capnp/message.h>
#include <kj/debug.h>

#include "actor/errors.h"

namespace troupe::detail {

namespace {

// Cap'n Proto's own readers refuse more segments than this too.
constexpr uint32_t MAX_SEGMENTS = 512;

// A message read from the stream: owns its words and the segment table pointing into them.
class OwnedMessageReader final : public capnp::MessageReader {
public:
  OwnedMessageReader(kj::Array<capnp::word> words, kj::Array<kj::ArrayPtr<const capnp::word>> table,
                     capnp::ReaderOptions options)
      : capnp::MessageReader(options), words(kj::mv(words)), table(kj::mv(table)) {}

  kj::ArrayPtr<const capnp::word> getSegment(uint id) override {
    return id < table.size() ? table[id] : nullptr;
  }

private:
  kj::Array<capnp::word> words;
  kj::Array<kj::ArrayPtr<const capnp::word>> table;
};

}  // namespace

BoundedMessageStream::BoundedMessageStream(kj::AsyncIoStream& stream, uint64_t maxMessageBytes)
    : stream(stream), maxMessageBytes(maxMessageBytes) {}

kj::Promise<kj::Maybe<capnp::MessageReaderAndFds>> BoundedMessageStream::tryReadMessage(
    kj::ArrayPtr<kj::AutoCloseFd>, capnp::ReaderOptions options, kj::ArrayPtr<capnp::word>) {
  return stream.tryRead(header, sizeof(header), sizeof(header))
      .then([this, options](size_t n) -> kj::Promise<kj::Maybe<capnp::MessageReaderAndFds>> {
        if (n == 0) return kj::Maybe<capnp::MessageReaderAndFds>(nullptr);
        if (n < sizeof(header)) {
          return KJ_EXCEPTION(DISCONNECTED, "connection closed in the middle of a message header");
        }
        return readRest(options);
      });
}

kj::Promise<kj::Maybe<capnp::MessageReaderAndFds>> BoundedMessageStream::readRest(
    capnp::ReaderOptions options) {
  uint32_t segmentCount = header[0] + 1;  // wraps to 0 for 0xffffffff
  if (segmentCount == 0 || segmentCount > MAX_SEGMENTS) {
    return KJ_EXCEPTION(FAILED, "malformed message: bad segment count", header[0]);
  }
  // The rest of the table: the other sizes, padded to a whole word.
  size_t moreSizes = segmentCount - 1;
  size_t tableBytes = (moreSizes * 4 + 4) & ~size_t{7};
  auto sizes = kj::heapArray<uint32_t>(tableBytes / 4 + 1);
  sizes[0] = header[1];
  auto readTable = tableBytes == 0 ? kj::Promise<void>(kj::READY_NOW)
                                   : stream.read(sizes.begin() + 1, tableBytes);
  return readTable.then([this, options, segmentCount, sizes = kj::mv(sizes)]() mutable
                        -> kj::Promise<kj::Maybe<capnp::MessageReaderAndFds>> {
    uint64_t totalWords = 0;
    for (uint32_t i = 0; i < segmentCount; ++i) totalWords += sizes[i];
    uint64_t totalBytes = totalWords * sizeof(capnp::word);
    if (totalBytes > maxMessageBytes) {
      return makeError(ErrorCode::MESSAGE_TOO_LARGE,
                       kj::str("incoming message of ", totalBytes, " bytes exceeds this side's ",
                               maxMessageBytes, "-byte limit; closing the connection"));
    }
    auto words = kj::heapArray<capnp::word>(totalWords);
    auto table = kj::heapArray<kj::ArrayPtr<const capnp::word>>(segmentCount);
    size_t offset = 0;
    for (uint32_t i = 0; i < segmentCount; ++i) {
      table[i] = words.slice(offset, offset + sizes[i]);
      offset += sizes[i];
    }
    auto body = words.asBytes();
    auto read = stream.tryRead(body.begin(), body.size(), body.size());
    return read.then([body, options, words = kj::mv(words), table = kj::mv(table)](
                         size_t n) mutable -> kj::Maybe<capnp::MessageReaderAndFds> {
      if (n < body.size()) {
        kj::throwFatalException(
            KJ_EXCEPTION(DISCONNECTED, "connection closed in the middle of a message"));
      }
      capnp::ReaderOptions generous = options;
      generous.traversalLimitInWords = options.traversalLimitInWords * TRAVERSAL_FACTOR;
      return capnp::MessageReaderAndFds{
          kj::heap<OwnedMessageReader>(kj::mv(words), kj::mv(table), generous), nullptr};
    });
  });
}

kj::Promise<void> BoundedMessageStream::writeMessage(
    kj::ArrayPtr<const int>, kj::ArrayPtr<const kj::ArrayPtr<const capnp::word>> segments) {
  return capnp::writeMessage(stream, segments);
}

kj::Promise<void> BoundedMessageStream::writeMessages(
    kj::ArrayPtr<kj::ArrayPtr<const kj::ArrayPtr<const capnp::word>>> messages) {
  return capnp::writeMessages(stream, messages);
}

kj::Maybe<int> BoundedMessageStream::getSendBufferSize() {
  int size = 0;
  uint len = sizeof(size);
  KJ_IF_MAYBE(e, kj::runCatchingExceptions([&]() {
                stream.getsockopt(SOL_SOCKET, SO_SNDBUF, &size, &len);
              })) {
    (void)e;
    return nullptr;
  }
  return size;
}

kj::Promise<void> BoundedMessageStream::end() {
  stream.shutdownWrite();
  return kj::READY_NOW;
}

}  // namespace troupe::detail
