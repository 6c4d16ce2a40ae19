// blobChecksum() with AVX2 (compiled with -mavx2 on x86-64, called only where the CPU has it):
// the same XXH3-64, at about 1.6x the speed of the SSE2 build on the payloads blobs carry
// (bench/README.md, "Same host"). Nothing else in this file, so that no code shared with other
// files is built for AVX2.

#include <stddef.h>
#include <stdint.h>

#if defined(__x86_64__)
#define XXH_INLINE_ALL
#define XXH_VECTOR XXH_AVX2
#include <xxhash.h>

namespace troupe::actor_detail {

uint64_t blobChecksumAvx2(const void* bytes, size_t size) { return XXH3_64bits(bytes, size); }

}  // namespace troupe::actor_detail
#endif
