#pragma once
// Reading a large message's last segment straight into memory its receiver chose: how a blob's
// chunks land in their place in the blob without a copy (actor/detail/blob_receiver.h).

#include <stddef.h>

#include <capnp/common.h>
#include <kj/array.h>

namespace troupe {

// Where the large last segment of an incoming message may be read straight to, instead of into
// the message's own memory: a blob chunk (blob_receiver.h) goes to its place in the blob. Loop
// thread only.
class SegmentPlacement {
public:
  virtual ~SegmentPlacement() noexcept(false) = default;

  // `head`: every segment of the message but the last, read already (pointers into the last one
  // cannot be followed); the last is `lastWords` words. Returns exactly `lastWords` words to read
  // it into (holding whatever must live as long as the message), or null to read it with the
  // rest. Must not throw.
  virtual kj::Maybe<kj::Array<capnp::word>> place(
      kj::ArrayPtr<const kj::ArrayPtr<const capnp::word>> head, size_t lastWords) = 0;
};

// A message's last segment is offered to a SegmentPlacement when it is at least this large.
constexpr size_t PLACED_SEGMENT_MIN_BYTES = 64 * 1024;

}  // namespace troupe
