// blobChecksum() and copyWithChecksum() with AVX2 (compiled with -mavx2 on x86-64, called only
// where the CPU has it): the same XXH3-64, at about 1.6x the speed of the SSE2 build on the
// payloads blobs carry (bench/README.md, "Same host"). Nothing else in this file, so that no
// code shared with other files is built for AVX2.

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#if defined(__x86_64__)
#include <immintrin.h>

#define XXH_INLINE_ALL
#define XXH_VECTOR XXH_AVX2
#include <xxhash.h>

namespace troupe::actor_detail {

namespace {

// Copies with stores that bypass the cache: the destination's lines are not read in first only
// to be overwritten (that read for ownership is a third of a plain copy's memory traffic). The
// caller fences.
void streamCopy(unsigned char* to, const unsigned char* from, size_t size) {
  size_t head = (32 - reinterpret_cast<uintptr_t>(to) % 32) % 32;
  if (head > size) head = size;
  memcpy(to, from, head);
  to += head;
  from += head;
  size -= head;
  size_t body = size & ~size_t{127};
  for (size_t i = 0; i < body; i += 128) {
    auto a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(from + i));
    auto b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(from + i + 32));
    auto c = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(from + i + 64));
    auto d = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(from + i + 96));
    _mm256_stream_si256(reinterpret_cast<__m256i*>(to + i), a);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(to + i + 32), b);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(to + i + 64), c);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(to + i + 96), d);
  }
  memcpy(to + body, from + body, size - body);
}

}  // namespace

uint64_t blobChecksumAvx2(const void* bytes, size_t size) { return XXH3_64bits(bytes, size); }

uint64_t copyWithChecksumAvx2(void* to, const void* from, size_t size, size_t step) {
  auto* out = static_cast<unsigned char*>(to);
  auto* in = static_cast<const unsigned char*>(from);
  XXH3_state_t state;
  XXH3_64bits_reset(&state);
  for (size_t at = 0; at < size; at += step) {
    size_t n = size - at < step ? size - at : step;
    // Hashed first, so that the copy reads the step from the cache.
    XXH3_64bits_update(&state, in + at, n);
    streamCopy(out + at, in + at, n);
  }
  _mm_sfence();
  return XXH3_64bits_digest(&state);
}

}  // namespace troupe::actor_detail
#endif
