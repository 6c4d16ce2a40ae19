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
#include <kj/time.h>

namespace troupe {

// Bodies smaller than this come from malloc as usual.
constexpr size_t CACHED_BUFFER_MIN_BYTES = 64 * 1024;

// What one thread keeps for reuse: at most this many buffers, holding at most this many bytes
// together. A buffer freed while the cache is full is returned to the system, and so is one
// that has waited BUFFER_CACHE_IDLE_SECONDS without being reused, so a process that stops
// moving large messages gives the memory back.
//
// Idle time is loop time: the EventLoop of the thread calls trimMessageBuffers() once per
// BUFFER_CACHE_TRIM_INTERVAL of its timer() (the real monotonic clock, or a manual one that a
// test advances), and a cached buffer is given back at the first trim after it has waited more
// than BUFFER_CACHE_IDLE_SECONDS: more than BUFFER_CACHE_IDLE_SECONDS and at most
// BUFFER_CACHE_IDLE_SECONDS + one interval after it was cached (on a busy loop, plus however
// late that trim runs). Time while the thread has no loop does not count.
constexpr size_t BUFFER_CACHE_MAX_BUFFERS = 16;
constexpr size_t BUFFER_CACHE_MAX_BYTES = size_t{1} << 30;
constexpr unsigned BUFFER_CACHE_IDLE_SECONDS = 2;
constexpr kj::Duration BUFFER_CACHE_TRIM_INTERVAL = 1 * kj::SECONDS;
static_assert(BUFFER_CACHE_IDLE_SECONDS * kj::SECONDS % BUFFER_CACHE_TRIM_INTERVAL ==
                  0 * kj::SECONDS,
              "the idle time is a whole number of trim intervals");

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

// A loop trims this thread's cache from beginTrimming...() to endTrimming...() (EventLoop calls
// them; they nest). A large buffer dropped on a thread no loop trims (a Python thread letting go
// of a tensor it kept, say) goes back to the system at once: nothing would ever trim it there.
void beginTrimmingMessageBuffers();
void endTrimmingMessageBuffers();

// Counts `intervals` BUFFER_CACHE_TRIM_INTERVALs as gone by on this thread, then returns to the
// system the buffers cached here that have now waited more than BUFFER_CACHE_IDLE_SECONDS' worth
// of them. The cache keeps no clock of its own: called by the thread's EventLoop only.
void trimMessageBuffers(uint64_t intervals);

// Buffers currently cached on this thread, and their total size (for tests and benchmarks).
size_t cachedMessageBuffers();
size_t cachedMessageBufferBytes();

}  // namespace troupe
