#include "troupe/net/limits.h"

#include <string_view>

#include <kj/string.h>

#include "troupe/base/errors.h"
#include "troupe/base/parse_number.h"

namespace troupe {

namespace {

constexpr uint64_t MiB = uint64_t{1} << 20;

// A limit: "512 MiB (536870912 bytes)", or its bytes alone when it is not a whole number of MiB.
kj::String limitText(uint64_t bytes) {
  if (bytes % MiB == 0) return kj::str(bytes / MiB, " MiB (", bytes, " bytes)");
  return kj::str(bytes, " bytes");
}

// What to do instead, the same in every such error.
constexpr const char* USE_BLOBS =
    "; it was not sent. Send payloads this large as blobs, streamed in chunks: sendBlob or "
    "ActorPool::broadcastBlob to servers that acceptBlobs (troupe/actor/blob.h), "
    "Pool.broadcast_blob in Python";

// How incomingTooLarge() ends, after the limit.
constexpr const char* INCOMING_LIMIT_END = "-byte limit; closing the connection";

// What Cap'n Proto's builders fail with for a size that does not fit its bits (capnp/layout.c++):
// kj::ThrowOverflow's, and its own words for a Data or Text, a list and a segment.
constexpr const char* TOO_LARGE_TO_BUILD[] = {
    "integer overflow",
    "text blob too big",
    "tried to allocate list with too many elements",
    "requested object size exceeds maximum segment size",
};

}  // namespace

kj::Exception messageTooLarge(uint64_t bytes, uint64_t maxMessageBytes) {
  return makeError(ErrorCode::MESSAGE_TOO_LARGE,
                   kj::str("a message of ", bytes, " bytes is over the limit of ",
                           limitText(maxMessageBytes), " per message (maxMessageBytes)",
                           USE_BLOBS));
}

kj::Exception incomingTooLarge(uint64_t bytes, uint64_t maxMessageBytes) {
  return makeError(ErrorCode::MESSAGE_TOO_LARGE,
                   kj::str("incoming message of ", bytes, " bytes exceeds this side's ",
                           maxMessageBytes, INCOMING_LIMIT_END));
}

kj::Maybe<uint64_t> peerMessageLimit(const kj::Exception& e) {
  std::string_view text = e.getDescription().cStr();
  constexpr std::string_view START = "troupe.message_too_large: incoming message of ";
  constexpr std::string_view MARKER = " bytes exceeds this side's ";
  auto at = text.find(MARKER);
  if (!fromPeer(e) || text.find(START) == text.npos || at == text.npos) return nullptr;
  auto rest = text.substr(at + MARKER.size());
  auto end = rest.find(INCOMING_LIMIT_END);
  if (end == rest.npos) return nullptr;
  return parseWholeNumber(kj::ArrayPtr<const char>(rest.data(), end));
}

kj::Maybe<kj::Exception> tooLargeToBuild(const kj::Exception& e, uint64_t maxMessageBytes) {
  if (e.getType() != kj::Exception::Type::FAILED) return nullptr;
  bool tooLarge = false;
  for (auto* description : TOO_LARGE_TO_BUILD) {
    tooLarge = tooLarge || e.getDescription() == description;
  }
  if (!tooLarge) return nullptr;
  return makeError(ErrorCode::MESSAGE_TOO_LARGE,
                   kj::str("a value in the message is too large for Cap'n Proto (a Data or Text "
                           "holds less than 512 MiB, a list less than 2^29 elements), and a "
                           "message may hold at most ",
                           limitText(maxMessageBytes), " (maxMessageBytes)", USE_BLOBS));
}

}  // namespace troupe
