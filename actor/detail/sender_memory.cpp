#include "troupe/actor/detail/sender_memory.h"

#include <errno.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <time.h>

#include <limits>

#include <kj/debug.h>

#include "troupe/base/errors.h"

namespace troupe::actor_detail {

namespace {

// The inode of `path` (a namespace), or 0 where it cannot be read.
ino_t inodeOf(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 ? st.st_ino : 0;
}

}  // namespace

int64_t SenderMemory::now() {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return int64_t{t.tv_sec} * 1000000000 + t.tv_nsec;
}

kj::Maybe<kj::Own<SenderMemory>> SenderMemory::open(std::shared_ptr<const LocalPeer> peer,
                                                    uint64_t address, uint64_t size,
                                                    kj::String& why) {
  if (size == 0 || address == 0 || address + size < address) {
    why = kj::str("no memory to read at ", address, " for ", size, " bytes");
    return nullptr;
  }
  // Kernels before time namespaces (5.6) have one clock for all.
  auto ours = inodeOf("/proc/self/ns/time");
  if (ours != 0 && inodeOf("/proc/" + std::to_string(peer->pid) + "/ns/time") != ours) {
    why = kj::str("process ", peer->pid, " is in another time namespace, or gone");
    return nullptr;
  }
  auto memory = kj::heap<SenderMemory>(kj::mv(peer), address, size);
  kj::byte first;
  KJ_IF_MAYBE(e, kj::runCatchingExceptions(
                     [&]() { memory->read(&first, 0, 1, std::numeric_limits<int64_t>::max()); })) {
    why = kj::str(e->getDescription());
    return nullptr;
  }
  return kj::mv(memory);
}

void SenderMemory::read(kj::byte* to, uint64_t offset, uint64_t length, int64_t heldUntil) {
  KJ_REQUIRE(offset <= size && length <= size - offset, "a read past the sender's blob");
  auto pid = peer->pid;
  uint64_t done = 0;
  while (done < length) {
    struct iovec local = {to + done, static_cast<size_t>(length - done)};
    struct iovec remote = {reinterpret_cast<void*>(address + offset + done),
                           static_cast<size_t>(length - done)};
    ssize_t n = ::process_vm_readv(pid, &local, 1, &remote, 1, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      int error = n < 0 ? errno : EFAULT;
      if (peer->exited()) break;
      throwError(ErrorCode::FAILED,
                 kj::str("process_vm_readv() of ", length,
                         " bytes of the sender's memory "
                         "(process ",
                         pid, "): ", strerror(error),
                         error == EPERM ? " (the kernel's ptrace rules: Yama's ptrace_scope, an "
                                          "undumpable sender, or a seccomp filter)"
                                        : ""));
    }
    done += static_cast<uint64_t>(n);
  }
  // The process, alive now, is the one whose memory was read: its id names no other while it
  // lives. And it still held the memory for the blob when the copy ended.
  if (peer->exited()) {
    throwError(ErrorCode::DISCONNECTED,
               kj::str("the sender (process ", pid, ") exited while its memory was read"));
  }
  if (now() > heldUntil) {
    throwError(ErrorCode::DISCONNECTED, kj::str("the chunk at byte ", offset,
                                                " was read after the sender's hold on its "
                                                "memory ended (this member's loop was held up)"));
  }
}

}  // namespace troupe::actor_detail
