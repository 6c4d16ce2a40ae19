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

// The size in words of segment `i` in the segment table at `table`.
inline uint32_t segmentWords(const kj::byte* table, uint32_t i) {
  return readLe32(table + 4 + i * 4);
}

// The words of the `count` segments the table at `table` announces, all together.
inline uint64_t announcedWords(const kj::byte* table, uint32_t count) {
  uint64_t total = 0;
  for (uint32_t i = 0; i < count; ++i) total += segmentWords(table, i);
  return total;
}

// Points each of `into` (the first into.size() segments of the table at `table`) at its words,
// one after another from the start of `words`, which must hold them.
inline void sliceSegments(const kj::byte* table, kj::ArrayPtr<const capnp::word> words,
                          kj::ArrayPtr<kj::ArrayPtr<const capnp::word>> into) {
  size_t offset = 0;
  for (uint32_t i = 0; i < into.size(); ++i) {
    size_t size = segmentWords(table, i);
    into[i] = words.slice(offset, offset + size);
    offset += size;
  }
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

// Writes the whole message, table then segments, at `out`, which has room for it.
inline void writeFramed(kj::byte* out,
                        kj::ArrayPtr<const kj::ArrayPtr<const capnp::word>> segments) {
  writeTable(out, segments);
  out += tableBytes(segments.size());
  for (auto& s : segments) {
    auto b = s.asBytes();
    memcpy(out, b.begin(), b.size());
    out += b.size();
  }
}

}  // namespace troupe::net_detail
