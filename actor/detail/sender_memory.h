#pragma once
// A blob sender's memory, read from a receiver in another process on the same host with the
// kernel's cross-process copy (process_vm_readv): one copy, straight into the receiver's blob,
// and no work at all for the sender. The kernel allows it only where the receiver may trace the
// sender (the same user, the sender not undumpable, Yama's ptrace_scope, no seccomp filter in the
// way); the receiver reads only the process at the other end of its connection.

#include <stdint.h>

#include <memory>

#include <kj/common.h>
#include <kj/memory.h>
#include <kj/string.h>

#include "troupe/net/same_host.h"

namespace troupe::actor_detail {

// Reads on the calling thread, blocking it for the copy. Not thread-safe.
class SenderMemory {
public:
  // The blob of `size` bytes at `address` in `peer`'s memory. Null, with `why` set, where this
  // process cannot read it: the process gone, in another time namespace (whose clock would not
  // tell when its hold ends: read()), or the kernel refusing the first byte.
  static kj::Maybe<kj::Own<SenderMemory>> open(std::shared_ptr<const LocalPeer> peer,
                                               uint64_t address, uint64_t size, kj::String& why);

  // Copies bytes [offset, offset + length) of the blob to `to`. The sender holds that memory for
  // the blob until `heldUntil` on its CLOCK_MONOTONIC, which is this process's. Throws
  // DISCONNECTED when the sender exited before the copy was done, or the copy ended past
  // `heldUntil` (what was copied may be another's bytes then); FAILED when the kernel could not
  // read them.
  void read(kj::byte* to, uint64_t offset, uint64_t length, int64_t heldUntil);

  // Now on CLOCK_MONOTONIC, in nanoseconds: what a sender's heldUntil is counted in.
  static int64_t now();

  // Use open(), which checks that the memory can be read.
  SenderMemory(std::shared_ptr<const LocalPeer> peer, uint64_t address, uint64_t size)
      : peer(kj::mv(peer)), address(address), size(size) {}
  KJ_DISALLOW_COPY(SenderMemory);

private:
  const std::shared_ptr<const LocalPeer> peer;
  const uint64_t address;
  const uint64_t size;
};

}  // namespace troupe::actor_detail
