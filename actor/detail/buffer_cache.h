#pragma once
// Memory for large message bodies, reused from one message to the next on the same thread.
//
// A freshly allocated multi-megabyte buffer costs a page fault per 4 KiB page the first time it
// is written (the kernel maps and zeroes each page), and glibc hands large blocks back to the
// kernel when they are freed, so a connection that receives one 64 MiB tensor after another
// would fault in 16384 pages for every message. Buffers taken here go back to a small
// per-thread cache when their message is dropped, and the next large message is read into
// memory that is already mapped.

#include <capnp/common.h>
#include <kj/array.h>

namespace troupe::detail {

// Bodies smaller than this come from malloc as usual.
constexpr size_t CACHED_BUFFER_MIN_BYTES = 64 * 1024;

// What one thread keeps for reuse: at most this many buffers, holding at most this many bytes
// together. A buffer freed while the cache is full is returned to the system, and so is one
// that has waited BUFFER_CACHE_IDLE_SECONDS without being reused (every EventLoop trims the
// cache of its thread once a second), so a process that stops moving large messages gives the
// memory back.
constexpr size_t BUFFER_CACHE_MAX_BUFFERS = 4;
constexpr size_t BUFFER_CACHE_MAX_BYTES = size_t{1} << 30;
constexpr unsigned BUFFER_CACHE_IDLE_SECONDS = 2;

// `words` words of uninitialised memory. Large requests reuse a cached buffer of at least that
// size (and not more than twice it) when one is free on this thread. Dropping the array gives
// the memory back to the cache of the thread that drops it. Throws std::bad_alloc as `new`
// does.
kj::Array<capnp::word> takeMessageBuffer(size_t words);

// Small outgoing messages are built in blocks of this many words, kept zeroed for reuse.
constexpr size_t SMALL_SEGMENT_WORDS = 1024;
constexpr size_t SMALL_SEGMENT_POOL_MAX = 64;  // per thread

// SMALL_SEGMENT_WORDS words, all zero, from this thread's pool when it has one. The caller must
// zero again every word it wrote before dropping the array, which returns it to the pool of
// the thread that drops it.
kj::Array<capnp::word> takeZeroedSegment();

// Returns to the system the buffers cached on this thread that have waited at least
// BUFFER_CACHE_IDLE_SECONDS.
void trimMessageBuffers();

// Buffers currently cached on this thread, and their total size (for tests and benchmarks).
size_t cachedMessageBuffers();
size_t cachedMessageBufferBytes();

}  // namespace troupe::detail
