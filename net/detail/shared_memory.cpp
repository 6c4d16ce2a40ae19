#include "troupe/net/detail/shared_memory.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/magic.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <algorithm>

#include <kj/debug.h>

#include "troupe/base/errors.h"

namespace troupe::net_detail {

namespace {

// Regions are made in steps of this, so that messages of nearly the same size share them.
constexpr uint64_t REGION_STEP_BYTES = 64 * 1024;

// A region serves a message down to this fraction of its size; a smaller one gets its own.
constexpr uint64_t REGION_MAX_WASTE = 2;

uint64_t roundUp(uint64_t n, uint64_t step) { return (n + step - 1) / step * step; }

kj::String why(const char* what, int error) { return kj::str(what, ": ", strerror(error)); }

}  // namespace

// ------------------------------------------------------------------------------------------------
// OutgoingRegions

OutgoingRegions::~OutgoingRegions() noexcept(false) {
  for (auto& [id, r] : regions) munmap(r.map, r.size);
}

kj::Maybe<OutgoingRegions::Slot> OutgoingRegions::take(size_t bytes) {
  ++uses;
  // The smallest idle region that fits, unless it is far larger than the message.
  Region* best = nullptr;
  uint32_t bestId = 0;
  for (auto& [id, r] : regions) {
    if (r.busy || r.size < bytes || r.size > bytes * REGION_MAX_WASTE + REGION_STEP_BYTES) {
      continue;
    }
    if (best == nullptr || r.size < best->size) {
      best = &r;
      bestId = id;
    }
  }
  if (best != nullptr) {
    best->busy = true;
    best->lastUse = uses;
    busy += best->size;
    return Slot{bestId, kj::arrayPtr(best->map, bytes), kj::AutoCloseFd(), best->size};
  }

  uint64_t size = roundUp(bytes, REGION_STEP_BYTES);
  if (busy + size > SHARED_MAX_BYTES) return nullptr;  // the socket takes it
  if (total + size > SHARED_MAX_BYTES) trimIdle(SHARED_MAX_BYTES - busy - size);
  // The receiver maps no more than SHARED_MAX_REGIONS.
  while (regions.size() >= SHARED_MAX_REGIONS) {
    if (!closeOldestIdle()) return nullptr;
  }

  int fd = memfd_create("troupe-message", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return cannotMake("memfd_create", errno);
  kj::AutoCloseFd owned(fd);
  // Sealed against shrinking, so that the receiver's reads can never fault past its end.
  if (ftruncate(fd, size) != 0) return cannotMake("ftruncate", errno);
  if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    return cannotMake("sealing a memfd", errno);
  }
  void* map = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (map == MAP_FAILED) return cannotMake("mmap", errno);
  uint32_t id = nextId++;
  auto& r = regions[id];
  r.map = static_cast<kj::byte*>(map);
  r.size = size;
  r.busy = true;
  r.lastUse = uses;
  total += size;
  busy += size;
  return Slot{id, kj::arrayPtr(r.map, bytes), kj::mv(owned), size};
}

kj::Maybe<OutgoingRegions::Slot> OutgoingRegions::cannotMake(const char* what, int error) {
  if (!failed) failureText = why(what, error);
  failed = true;
  return nullptr;
}

kj::Maybe<kj::String> OutgoingRegions::takeFailure() {
  auto taken = kj::mv(failureText);
  failureText = nullptr;
  return taken;
}

OutgoingRegions::Region& OutgoingRegions::busyRegion(uint32_t id, kj::StringPtr what) {
  auto it = regions.find(id);
  if (it == regions.end() || !it->second.busy) {
    kj::throwFatalException(
        makeError(ErrorCode::FAILED, kj::str("the peer ", what, " shared memory region ", id,
                                             ", which holds no message of this connection")));
  }
  return it->second;
}

void OutgoingRegions::release(uint32_t id) {
  auto& r = busyRegion(id, "released");
  r.busy = false;
  r.lastUse = ++uses;  // the last to go: the next message most likely fits it
  busy -= r.size;
  // While messages are in flight, as many idle bytes as busy ones are kept for those coming
  // after them; once all are back, SHARED_KEPT_IDLE_BYTES, or the one region just released.
  trimIdle(std::max({SHARED_KEPT_IDLE_BYTES, busy, r.size}));
}

void OutgoingRegions::retire(uint32_t id) {
  auto& r = busyRegion(id, "kept");
  munmap(r.map, r.size);
  busy -= r.size;
  total -= r.size;
  regions.erase(id);
}

void OutgoingRegions::trimIdle(uint64_t keep) {
  while (total - busy > keep && closeOldestIdle()) {
  }
}

bool OutgoingRegions::closeOldestIdle() {
  auto oldest = regions.end();
  for (auto it = regions.begin(); it != regions.end(); ++it) {
    if (it->second.busy) continue;
    if (oldest == regions.end() || it->second.lastUse < oldest->second.lastUse) oldest = it;
  }
  if (oldest == regions.end()) return false;
  munmap(oldest->second.map, oldest->second.size);
  total -= oldest->second.size;
  closed.add(oldest->first);
  regions.erase(oldest);
  return true;
}

// ------------------------------------------------------------------------------------------------
// IncomingRegions

MappedRegion::~MappedRegion() noexcept(false) { munmap(map, size); }

void IncomingRegions::add(uint32_t id, kj::AutoCloseFd fd, uint64_t size) {
  auto refuse = [&](kj::StringPtr what) {
    kj::throwFatalException(
        makeError(ErrorCode::FAILED, kj::str("the peer's shared memory region ", id, " ", what)));
  };
  if (regions.size() >= SHARED_MAX_REGIONS) refuse("is one too many");
  if (regions.count(id) > 0) refuse("was announced twice");
  if (size == 0 || size > SHARED_MAX_BYTES) refuse("has a size out of bounds");
  // A memfd on tmpfs (not hugetlbfs, whose reads can fault when its pool is empty), sealed
  // against shrinking: the file can never end before what was mapped of it.
  struct statfs fs;
  if (fstatfs(fd.get(), &fs) != 0 || fs.f_type != TMPFS_MAGIC) refuse("is not a memfd on tmpfs");
  int seals = fcntl(fd.get(), F_GET_SEALS);
  if (seals < 0 || (seals & F_SEAL_SHRINK) == 0) refuse("is not a memfd sealed against shrinking");
  struct stat st;
  if (fstat(fd.get(), &st) != 0 || static_cast<uint64_t>(st.st_size) < size) {
    refuse("is smaller than announced");
  }
  void* map = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd.get(), 0);
  if (map == MAP_FAILED) refuse(why("cannot be mapped", errno));
  regions[id] = kj::atomicRefcounted<MappedRegion>(static_cast<kj::byte*>(map), size);
}

kj::Own<const MappedRegion> IncomingRegions::at(uint32_t id, uint64_t offset, uint64_t bytes) {
  auto it = regions.find(id);
  if (it == regions.end()) {
    kj::throwFatalException(makeError(
        ErrorCode::FAILED, kj::str("a message in shared memory region ", id, ", never announced")));
  }
  auto& r = *it->second;
  if (offset > r.size || bytes > r.size - offset) {
    kj::throwFatalException(
        makeError(ErrorCode::FAILED, kj::str("a message outside shared memory region ", id, " (",
                                             offset, "+", bytes, " of ", r.size, " bytes)")));
  }
  return kj::atomicAddRef(r);
}

void IncomingRegions::forget(uint32_t id) { regions.erase(id); }

}  // namespace troupe::net_detail
