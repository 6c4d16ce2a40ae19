#pragma once
// A blob sender's memory, read from a receiver in another process on the same host with the
// kernel's cross-process copy (process_vm_readv): one copy, straight into the receiver's blob,
// and no work at all for the sender. The kernel allows it only where the receiver could trace
// the sender (the same user, the sender not marked undumpable, no Yama restriction in the way),
// so it grants no access a process did not have already.

#include <stdint.h>
#include <sys/types.h>

#include <kj/array.h>
#include <kj/common.h>
#include <kj/io.h>
#include <kj/memory.h>
#include <kj/string.h>

namespace troupe::actor_detail {

class SenderMemory {
public:
  // The blob of `size` bytes at `address` in process `pid`. Throws, saying why, where this
  // process cannot read it: no pidfd_open() (a kernel before 5.3), the process gone, the kernel
  // refusing (another user, an undumpable process, Yama's ptrace_scope, a seccomp filter), or
  // the first byte not readable.
  static kj::Own<SenderMemory> open(pid_t pid, uint64_t address, uint64_t size);
  SenderMemory(pid_t pid, uint64_t address, uint64_t size, kj::AutoCloseFd pidfd);
  KJ_DISALLOW_COPY(SenderMemory);

  // Copies bytes [offset, offset + length) of the blob to `to`. Throws DISCONNECTED when the
  // sender exited before the copy was done (whatever was copied may be another process's),
  // FAILED when the kernel could not read them.
  void read(kj::byte* to, uint64_t offset, uint64_t length);

private:
  const pid_t pid;
  const uint64_t address;
  const uint64_t size;
  kj::AutoCloseFd pidfd;  // the process itself: its id may name another once it exited
};

}  // namespace troupe::actor_detail
