#include "troupe/base/buffer_cache.h"

#include <stdlib.h>
#include <string.h>

#include <new>

#include <kj/debug.h>
#include <kj/vector.h>

namespace troupe {

namespace {

// A cached buffer: `capacity` words at `words`, preceded by one word holding the capacity (an
// array's disposer is only told the array's size).
struct Block {
  capnp::word* words;
  size_t capacity;
  uint64_t cachedAtTrim = 0;  // the cache's trim count when it was cached
};

// Trims a buffer must stay unused through to be given back: a buffer cached between trims k and
// k + 1 goes at trim k + IDLE_TRIMS + 1, more than IDLE_TRIMS intervals and at most one more.
constexpr uint64_t IDLE_TRIMS = BUFFER_CACHE_IDLE_SECONDS * kj::SECONDS /
                                BUFFER_CACHE_TRIM_INTERVAL;

Block allocateBlock(size_t words) {
  auto* base = static_cast<capnp::word*>(malloc((words + 1) * sizeof(capnp::word)));
  if (base == nullptr) throw std::bad_alloc();
  memcpy(static_cast<void*>(base), &words, sizeof(words));
  return Block{base + 1, words, 0};
}

Block blockOf(capnp::word* words) {
  size_t capacity;
  memcpy(&capacity, static_cast<const void*>(words - 1), sizeof(capacity));
  return Block{words, capacity, 0};
}

void freeBlock(Block b) { free(b.words - 1); }

// Set while this thread's cache exists: an array dropped during thread exit, after the cache
// is gone, frees its memory directly.
thread_local bool cacheAlive = false;

// How many loops trim this thread's cache now.
thread_local unsigned trimmingLoops = 0;

class ThreadCache {
public:
  ThreadCache() { cacheAlive = true; }
  ~ThreadCache() {
    cacheAlive = false;
    for (auto& b : blocks) freeBlock(b);
    for (auto* p : zeroed) free(p);
  }

  // A cached block of at least `words` and at most twice that, or nullptr.
  kj::Maybe<Block> take(size_t words) {
    for (size_t i = 0; i < blocks.size(); ++i) {
      auto b = blocks[i];
      if (b.capacity >= words && b.capacity / 2 <= words) {
        blocks[i] = blocks.back();
        blocks.removeLast();
        bytes -= b.capacity * sizeof(capnp::word);
        return b;
      }
    }
    return nullptr;
  }

  void give(Block b) {
    size_t size = b.capacity * sizeof(capnp::word);
    if (size > BUFFER_CACHE_MAX_BYTES) {
      freeBlock(b);
      return;
    }
    // Make room by dropping the smallest blocks: the large ones are the expensive ones to fault in.
    while (!blocks.empty() &&
           (blocks.size() >= BUFFER_CACHE_MAX_BUFFERS || bytes + size > BUFFER_CACHE_MAX_BYTES)) {
      size_t smallest = 0;
      for (size_t i = 1; i < blocks.size(); ++i) {
        if (blocks[i].capacity < blocks[smallest].capacity) smallest = i;
      }
      if (blocks[smallest].capacity > b.capacity) {
        freeBlock(b);  // everything cached is larger: keep that instead
        return;
      }
      bytes -= blocks[smallest].capacity * sizeof(capnp::word);
      freeBlock(blocks[smallest]);
      blocks[smallest] = blocks.back();
      blocks.removeLast();
    }
    b.cachedAtTrim = trims;
    blocks.add(b);
    bytes += size;
  }

  void trim(uint64_t intervals) {
    trims += intervals;
    for (size_t i = 0; i < blocks.size();) {
      if (trims - blocks[i].cachedAtTrim > IDLE_TRIMS) {
        bytes -= blocks[i].capacity * sizeof(capnp::word);
        freeBlock(blocks[i]);
        blocks[i] = blocks.back();
        blocks.removeLast();
      } else {
        ++i;
      }
    }
  }

  kj::Maybe<capnp::word*> takeZeroed() {
    if (zeroed.empty()) return nullptr;
    auto* p = zeroed.back();
    zeroed.removeLast();
    return p;
  }

  void giveZeroed(capnp::word* p) {
    if (zeroed.size() >= SMALL_SEGMENT_POOL_MAX) {
      free(p);
    } else {
      zeroed.add(p);
    }
  }

  size_t count() const { return blocks.size(); }
  size_t totalBytes() const { return bytes; }

private:
  kj::Vector<Block> blocks;
  size_t bytes = 0;
  uint64_t trims = 0;               // trim intervals counted on this thread
  kj::Vector<capnp::word*> zeroed;  // SMALL_SEGMENT_WORDS each, all zero
};

ThreadCache& threadCache() {
  static thread_local ThreadCache cache;
  return cache;
}

class CachingDisposer final : public kj::ArrayDisposer {
  void disposeImpl(void* first, size_t, size_t, size_t, void (*)(void*)) const override {
    auto block = blockOf(static_cast<capnp::word*>(first));
    if (cacheAlive && trimmingLoops > 0) {
      threadCache().give(block);
    } else {
      freeBlock(block);
    }
  }
};

const CachingDisposer cachingDisposer;

class ZeroedSegmentDisposer final : public kj::ArrayDisposer {
  void disposeImpl(void* first, size_t, size_t, size_t, void (*)(void*)) const override {
    if (cacheAlive) {
      threadCache().giveZeroed(static_cast<capnp::word*>(first));
    } else {
      free(first);
    }
  }
};

const ZeroedSegmentDisposer zeroedSegmentDisposer;

}  // namespace

kj::Array<capnp::word> takeMessageBuffer(size_t words) {
  if (words * sizeof(capnp::word) < CACHED_BUFFER_MIN_BYTES) {
    return kj::heapArray<capnp::word>(words);
  }
  Block block;
  KJ_IF_MAYBE(cached, threadCache().take(words)) {
    block = *cached;
  } else {
    block = allocateBlock(words);
  }
  return kj::Array<capnp::word>(block.words, words, cachingDisposer);
}

kj::Array<capnp::word> takeZeroedSegment() {
  capnp::word* words;
  KJ_IF_MAYBE(p, threadCache().takeZeroed()) {
    words = *p;
  } else {
    words = static_cast<capnp::word*>(calloc(SMALL_SEGMENT_WORDS, sizeof(capnp::word)));
    if (words == nullptr) throw std::bad_alloc();
  }
  return kj::Array<capnp::word>(words, SMALL_SEGMENT_WORDS, zeroedSegmentDisposer);
}

void beginTrimmingMessageBuffers() { ++trimmingLoops; }

void endTrimmingMessageBuffers() {
  KJ_ASSERT(trimmingLoops > 0);
  --trimmingLoops;
}

void trimMessageBuffers(uint64_t intervals) {
  if (cacheAlive) threadCache().trim(intervals);
}

size_t cachedMessageBuffers() { return threadCache().count(); }
size_t cachedMessageBufferBytes() { return threadCache().totalBytes(); }

}  // namespace troupe
