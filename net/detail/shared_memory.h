#pragma once
// Large messages between two processes of one user on one host, through shared memory rather
// than a unix socket's buffers (DESIGN.md, "Same host"). The sender copies a message, framed as
// on the wire, into a region of its own (a sealed memfd) and sends a 32-byte frame naming where
// it lies; the region's descriptor crosses the socket once, with SCM_RIGHTS, when the region is
// new. The receiver reads the message where it lies and says when it is done with it; the region
// then carries the next one. Regions are kept for reuse, so that their pages are not faulted in
// again for every message.
//
// A control frame takes the place of a message on the stream. Its first word starts with a
// segment count no Cap'n Proto message has (0xFFFFFFFF), so a peer that did not ask for them
// fails on the first one instead of misreading it; each side sends them only after the other
// said HELLO.

#include <stdint.h>

#include <map>

#include <kj/array.h>
#include <kj/io.h>
#include <kj/refcount.h>
#include <kj/string.h>
#include <kj/vector.h>

namespace troupe::net_detail {

// A message of at least this many bytes, framing included, goes through shared memory.
constexpr size_t SHARED_MIN_MESSAGE_BYTES = 64 * 1024;

// What a connection's regions may hold at once: messages sent and not yet released, plus the
// regions kept idle for the next ones. A message that would pass it goes through the socket.
constexpr uint64_t SHARED_MAX_BYTES = 320ull << 20;

// Idle regions a connection keeps for its next messages, at most, once none is in use (while
// some are, as many idle bytes as are in use; and always the region released last); beyond that
// they are closed.
constexpr uint64_t SHARED_KEPT_IDLE_BYTES = 64ull << 20;

// Regions a receiver keeps mapped for one connection, at most: a peer announcing more is cut off.
constexpr size_t SHARED_MAX_REGIONS = 256;

constexpr uint32_t CONTROL_MARK = 0xFFFFFFFFu;

enum class ControlKind : uint32_t {
  HELLO = 1,    // either side: it can take shared-memory frames
  REGION = 2,   // sender: a new region, its descriptor attached; `a` = its size
  MESSAGE = 3,  // sender: a message at offset `a`, `b` bytes long, in `region`
  RELEASE = 4,  // receiver: done with the message in `region`
  FORGET = 5,   // sender: `region` is closed; unmap it once no message in it is held
  KEPT = 6,     // receiver: it keeps the message in `region` (keepReceivedBytes()); retire it
};

// 32 bytes, little-endian as the wire.
struct ControlFrame {
  ControlFrame() = default;
  ControlFrame(ControlKind kind, uint32_t region = 0, uint64_t a = 0, uint64_t b = 0)
      : kind(kind), region(region), a(a), b(b) {}

  uint32_t mark = CONTROL_MARK;
  ControlKind kind = ControlKind::HELLO;
  uint32_t region = 0;
  uint32_t reserved = 0;
  uint64_t a = 0;
  uint64_t b = 0;
};
static_assert(sizeof(ControlFrame) == 32);

// The sender's regions of one connection. Loop thread only.
class OutgoingRegions {
public:
  OutgoingRegions() = default;
  ~OutgoingRegions() noexcept(false);
  KJ_DISALLOW_COPY(OutgoingRegions);

  struct Slot {
    uint32_t region;
    kj::ArrayPtr<kj::byte> memory;  // `bytes` long, for the framed message
    kj::AutoCloseFd newFd;          // the region's descriptor when it is new (send it), else none
    uint64_t regionBytes;
  };

  // A free region that holds `bytes`, made when none does. Null when that would pass
  // SHARED_MAX_BYTES or SHARED_MAX_REGIONS (idle regions are closed first to make room), or
  // when a region cannot be made (no memfd, out of memory, a file size limit): then
  // takeFailure() says why. A region keeps no descriptor: its mapping holds it.
  kj::Maybe<Slot> take(size_t bytes);

  // The receiver is done with the message in `region`. Throws FAILED for a region not in use.
  void release(uint32_t region);

  // The receiver keeps the message in `region`: the region is closed here and never used again
  // (the receiver's mapping keeps its memory). Throws FAILED for a region not in use.
  void retire(uint32_t region);

  // The regions closed since the last call (to make room, or to keep no more than
  // SHARED_KEPT_IDLE_BYTES idle): the receiver must be told to forget them.
  kj::Vector<uint32_t> takeClosed() { return kj::mv(closed); }

  // Why the first region that could not be made could not, once: null after that, and while
  // every one could be made.
  kj::Maybe<kj::String> takeFailure();

private:
  struct Region {
    kj::byte* map = nullptr;
    uint64_t size = 0;
    bool busy = false;
    uint64_t lastUse = 0;
  };
  // Closes idle regions, least recently used first, until at most `keep` bytes are idle.
  void trimIdle(uint64_t keep);
  // Closes the least recently used idle region; false when none is idle.
  bool closeOldestIdle();
  // The region `id`, which must hold a message (the peer says it is done with it, or keeps
  // it: `what`); throws FAILED otherwise.
  Region& busyRegion(uint32_t id, kj::StringPtr what);
  // Notes why a region could not be made (the first time only); returns null for take().
  kj::Maybe<Slot> cannotMake(const char* what, int error);

  std::map<uint32_t, Region> regions;
  kj::Vector<uint32_t> closed;
  uint32_t nextId = 1;
  uint64_t total = 0;
  uint64_t busy = 0;
  uint64_t uses = 0;
  bool failed = false;  // a region could not be made, and failureText said why
  kj::Maybe<kj::String> failureText;
};

// One region the receiver mapped, shared by the messages it holds and by whoever keeps bytes of
// one (keepReceivedBytes(), on any thread). Mapped copy-on-write: a keeper may write its bytes,
// and the sender's memory stays as it was.
class MappedRegion final : public kj::AtomicRefcounted {
public:
  MappedRegion(kj::byte* map, uint64_t size) : map(map), size(size) {}
  ~MappedRegion() noexcept(false);
  kj::byte* const map;
  const uint64_t size;
};

// The receiver's regions of one connection. Loop thread only.
class IncomingRegions {
public:
  // Maps the region announced with `fd`. Throws FAILED (the connection closes) when `fd` is not a
  // sealed memfd of at least `size` bytes, when the id is taken, or when there are
  // SHARED_MAX_REGIONS already.
  void add(uint32_t id, kj::AutoCloseFd fd, uint64_t size);

  // The region and the `bytes` at `offset` in it. Throws FAILED for an unknown region or a range
  // outside it.
  kj::Own<const MappedRegion> at(uint32_t id, uint64_t offset, uint64_t bytes);

  // The sender closed region `id`: it is unmapped once no message in it is held.
  void forget(uint32_t id);

private:
  std::map<uint32_t, kj::Own<const MappedRegion>> regions;
};

}  // namespace troupe::net_detail
