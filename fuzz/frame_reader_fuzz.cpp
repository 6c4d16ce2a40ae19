// BoundedMessageStream (the framing under every troupe connection) reading what a peer sent:
// arbitrary bytes, handed out in reads of every size. The first input byte sets the read size
// (0: as much as the reader has room for; n: n bytes, or more when the reader needs more); the
// rest is the stream.
//
// Checked against a plain reading of the framing rules, done here from the whole input at once:
// the same messages come out, each with exactly the segments the bytes hold, whatever the read
// size, and the stream ends the way the rules say (clean end, DISCONNECTED mid-message, FAILED
// for a bad segment count, MESSAGE_TOO_LARGE); each message, written back through the stream,
// is the frame it came in (with a zeroed padding word).

#include <string.h>

#include <capnp/message.h>
#include <kj/async.h>
#include <kj/vector.h>

#include "troupe/base/errors.h"
#include "troupe/net/detail/message_stream.h"
#include "fuzz/fuzz_support.h"

namespace troupe::fuzz {
namespace {

using net_detail::BoundedMessageStream;

// Small enough that announcing more than the limit is easy for the fuzzer, and that a message
// announced just under it costs little to allocate.
constexpr uint64_t MAX_MESSAGE_BYTES = 1 << 20;
constexpr uint64_t MAX_SEGMENTS = 512;  // what message_stream.cpp accepts

uint32_t readLe32(const kj::byte* p) {
  uint32_t v;
  memcpy(&v, p, sizeof(v));
  return v;
}

// A stream whose reads hand out `input`, `step` bytes at a time, and whose writes are kept.
class ScriptedStream final : public kj::AsyncIoStream {
public:
  ScriptedStream(kj::ArrayPtr<const kj::byte> input, size_t step) : input(input), step(step) {}

  kj::Promise<size_t> tryRead(void* buffer, size_t minBytes, size_t maxBytes) override {
    size_t n = step == 0 ? maxBytes : kj::max(minBytes, kj::min(step, maxBytes));
    n = kj::min(n, input.size());
    memcpy(buffer, input.begin(), n);
    input = input.slice(n, input.size());
    return n;
  }
  kj::Promise<void> write(const void* buffer, size_t size) override {
    written.addAll(kj::arrayPtr(static_cast<const kj::byte*>(buffer), size));
    return kj::READY_NOW;
  }
  kj::Promise<void> write(kj::ArrayPtr<const kj::ArrayPtr<const kj::byte>> pieces) override {
    for (auto piece : pieces) written.addAll(piece);
    return kj::READY_NOW;
  }
  kj::Promise<void> whenWriteDisconnected() override { return kj::NEVER_DONE; }
  void shutdownWrite() override {}

  kj::Vector<kj::byte> written;

private:
  kj::ArrayPtr<const kj::byte> input;
  size_t step;
};

// One message as the framing rules cut it out of the input.
struct Frame {
  kj::ArrayPtr<const kj::byte> bytes;  // segment table, padding and segments
  kj::Vector<kj::ArrayPtr<const kj::byte>> segments;
};

// How the stream must end after its frames: null for a clean end, else the error's code.
struct Expected {
  kj::Vector<Frame> frames;
  kj::Maybe<ErrorCode> error;
};

// The framing rules, read from the whole input at once: a message starts with a word whose
// first half is the segment count minus one (the whole word is read before it is looked at); a
// table of 32-bit segment sizes in words follows, padded to a word; then the segments.
Expected frame(kj::ArrayPtr<const kj::byte> in) {
  Expected out;
  size_t at = 0;
  for (;;) {
    size_t left = in.size() - at;
    if (left == 0) return out;
    if (left < 8) {
      out.error = ErrorCode::DISCONNECTED;
      return out;
    }
    uint64_t count = uint64_t{readLe32(in.begin() + at)} + 1;
    if (count > MAX_SEGMENTS) {
      out.error = ErrorCode::FAILED;
      return out;
    }
    size_t table = (count / 2 + 1) * 8;
    if (left < table) {
      out.error = ErrorCode::DISCONNECTED;
      return out;
    }
    uint64_t words = 0;
    for (size_t i = 0; i < count; ++i) words += readLe32(in.begin() + at + 4 + 4 * i);
    if (words * 8 > MAX_MESSAGE_BYTES) {
      out.error = ErrorCode::MESSAGE_TOO_LARGE;
      return out;
    }
    if (left - table < words * 8) {
      out.error = ErrorCode::DISCONNECTED;
      return out;
    }
    Frame f;
    f.bytes = in.slice(at, at + table + words * 8);
    size_t segment = at + table;
    for (size_t i = 0; i < count; ++i) {
      size_t size = size_t{readLe32(in.begin() + at + 4 + 4 * i)} * 8;
      f.segments.add(in.slice(segment, segment + size));
      segment += size;
    }
    out.frames.add(kj::mv(f));
    at = segment;
  }
}

bool sameBytes(kj::ArrayPtr<const kj::byte> a, kj::ArrayPtr<const kj::byte> b) {
  return a.size() == b.size() && (a.size() == 0 || memcmp(a.begin(), b.begin(), a.size()) == 0);
}

// Checks one message read against its frame, reads its contents (bounds checks and the
// traversal limit at work; a malformed body is the receiver's exception to catch, not a crash),
// and writes it back.
void checkMessage(capnp::IncomingRpcMessage& message, const Frame& expected,
                  BoundedMessageStream& stream, ScriptedStream& io, kj::WaitScope& ws) {
  auto& reader = dynamic_cast<capnp::MessageReader&>(message);
  size_t count = expected.segments.size();
  kj::Vector<kj::ArrayPtr<const capnp::word>> segments;
  for (size_t i = 0; i < count; ++i) {
    auto segment = reader.getSegment(i);
    check(sameBytes(segment.asBytes(), expected.segments[i]), "a segment differs from its bytes");
    segments.add(segment);
  }
  check(reader.getSegment(count).size() == 0, "a segment past the table");

  kj::runCatchingExceptions([&]() { message.getBody().targetSize(); });

  KJ_IF_MAYBE(write, stream.queueMessage(segments.asPtr())) {
    write->wait(ws);
  }
  stream.whenWritten().wait(ws);
  auto frame = kj::heapArray(expected.bytes);
  size_t tableEnd = 4 + 4 * count;
  size_t table = (count / 2 + 1) * 8;
  memset(frame.begin() + tableEnd, 0, table - tableEnd);  // the writer pads with zeros
  check(sameBytes(io.written.asPtr(), frame), "a message written back differs from its frame");
  io.written.clear();
}

struct Loop {
  kj::EventLoop loop;
  kj::WaitScope ws{loop};
};

}  // namespace
}  // namespace troupe::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace troupe;
  using namespace troupe::fuzz;
  NoStackTraces noStackTraces;
  static Loop loop;
  if (size == 0) return 0;
  auto input = kj::arrayPtr(data + 1, size - 1);
  auto expected = frame(input);

  ScriptedStream io(input, data[0]);
  BoundedMessageStream stream(io, MAX_MESSAGE_BYTES, false);
  capnp::ReaderOptions options;
  options.traversalLimitInWords = MAX_MESSAGE_BYTES / sizeof(capnp::word);
  for (size_t i = 0;; ++i) {
    kj::Maybe<kj::Own<capnp::IncomingRpcMessage>> message;
    KJ_IF_MAYBE(e, kj::runCatchingExceptions(
                       [&]() { message = stream.readMessage(options).wait(loop.ws); })) {
      check(i == expected.frames.size(), "an error before the end of the messages");
      KJ_IF_MAYBE(code, expected.error) {
        check(errorCode(*e) == *code, "the stream failed with the wrong error");
      } else {
        check(false, "an error at a clean end of the stream");
      }
      return 0;
    }
    KJ_IF_MAYBE(m, message) {
      check(i < expected.frames.size(), "a message past the last frame");
      checkMessage(**m, expected.frames[i], stream, io, loop.ws);
    } else {
      check(i == expected.frames.size(), "the stream ended before its last frame");
      check(expected.error == nullptr, "a clean end where the frame is broken");
      return 0;
    }
  }
}
