#pragma once
// Cap'n Proto's stream framing, as BoundedMessageStream reads and writes it: a segment table
// (the count less one, then each segment's size in words, padded to a whole word), then the
// segments.

#include <stdint.h>
#include <string.h>

#include <capnp/common.h>
#include <kj/array.h>

namespace troupe::net_detail {

// Cap'n Proto's own readers refuse more segments than this too.
constexpr uint32_t MAX_SEGMENTS = 512;

// Bytes of the segment table of a message of `segments` segments, padded to a whole word.
inline size_t tableBytes(size_t segments) { return (segments / 2 + 1) * sizeof(capnp::word); }

inline uint32_t readLe32(const kj::byte* p) {
  uint32_t v;
  memcpy(&v, p, sizeof(v));  // the wire is little-endian, and so are the machines troupe runs on
  return v;
}

// Writes the segment table of a message of `segments` at `out` (tableBytes(segments.size())).
inline void writeTable(kj::byte* out,
                       kj::ArrayPtr<const kj::ArrayPtr<const capnp::word>> segments) {
  memset(out, 0, tableBytes(segments.size()));
  uint32_t count = static_cast<uint32_t>(segments.size() - 1);
  memcpy(out, &count, sizeof(count));
  for (size_t i = 0; i < segments.size(); ++i) {
    uint32_t words = static_cast<uint32_t>(segments[i].size());
    memcpy(out + 4 + i * 4, &words, sizeof(words));
  }
}

}  // namespace troupe::net_detail
