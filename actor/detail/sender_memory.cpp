#include "troupe/actor/detail/sender_memory.h"

#include <errno.h>
#include <poll.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <kj/debug.h>

#include "troupe/base/errors.h"

namespace troupe::actor_detail {

namespace {

// Whether the process `pidfd` refers to has exited (its pidfd reads as ready).
bool exited(int pidfd) {
  struct pollfd p = {pidfd, POLLIN, 0};
  return ::poll(&p, 1, 0) != 0;
}

}  // namespace

kj::Own<SenderMemory> SenderMemory::open(pid_t pid, uint64_t address, uint64_t size) {
  if (pid <= 0 || size == 0 || address == 0 || address + size < address) {
    throwError(ErrorCode::INVALID_ARGUMENT, "no memory of a sender to read");
  }
#if defined(SYS_pidfd_open)
  int fd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
#else
  int fd = -1;
  errno = ENOSYS;
#endif
  if (fd < 0) {
    throwError(ErrorCode::FAILED, kj::str("pidfd_open(", pid, "): ", strerror(errno)));
  }
  auto memory = kj::heap<SenderMemory>(pid, address, size, kj::AutoCloseFd(fd));
  kj::byte first;
  memory->read(&first, 0, 1);
  return memory;
}

SenderMemory::SenderMemory(pid_t pid, uint64_t address, uint64_t size, kj::AutoCloseFd pidfd)
    : pid(pid), address(address), size(size), pidfd(kj::mv(pidfd)) {}

void SenderMemory::read(kj::byte* to, uint64_t offset, uint64_t length) {
  KJ_REQUIRE(offset <= size && length <= size - offset, "a read past the sender's blob");
  uint64_t done = 0;
  while (done < length) {
    struct iovec local = {to + done, static_cast<size_t>(length - done)};
    struct iovec remote = {reinterpret_cast<void*>(address + offset + done),
                           static_cast<size_t>(length - done)};
    ssize_t n = ::process_vm_readv(pid, &local, 1, &remote, 1, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      int error = n < 0 ? errno : EFAULT;
      if (exited(pidfd.get())) break;
      throwError(ErrorCode::FAILED, kj::str("reading ", length, " bytes of the sender's memory (",
                                            "process ", pid, "): ", strerror(error)));
    }
    done += static_cast<uint64_t>(n);
  }
  // The process, alive now, is the one whose memory was read: its id names no other while it
  // lives.
  if (exited(pidfd.get())) {
    throwError(ErrorCode::DISCONNECTED,
               kj::str("the sender (process ", pid, ") exited while its memory was read"));
  }
}

}  // namespace troupe::actor_detail
