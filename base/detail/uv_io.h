#pragma once
// kj's low-level I/O on libuv: sockets and pipes are non-blocking file descriptors watched by a
// uv_poll_t each, so every byte troupe moves goes through the libuv loop. kj::newAsyncIoProvider()
// on top of this gives the full kj::Network (TCP, unix sockets, name lookups) that Cap'n Proto's
// RPC uses unmodified.

#include <kj/async-io.h>

#include "troupe/base/uv_handle.h"

namespace troupe::base_detail {

// Watches one file descriptor for readiness. Read (and write) interest stays registered while
// events keep finding a waiter, and is dropped only when an event fires with nobody waiting, so
// a busy stream costs no epoll_ctl per operation. Belongs to the loop thread; does not own the fd.
class FdWatcher {
public:
  FdWatcher(uv_loop_t* loop, int fd);
  ~FdWatcher() noexcept;
  KJ_DISALLOW_COPY(FdWatcher);

  // Each resolves once the fd may be ready for that operation (spurious wake-ups are possible:
  // retry the syscall). At most one waiter of each kind at a time; dropping the promise cancels.
  kj::Promise<void> whenReadable();
  kj::Promise<void> whenWritable();
  kj::Promise<void> whenHangup();

  class Waiter;

private:
  static void onPoll(uv_poll_t* handle, int status, int events);
  void want(int event);
  void setInterest(int events);

  UvHandle<uv_poll_t> handle;
  int interest = 0;
  kj::Maybe<Waiter&> readWaiter;
  kj::Maybe<Waiter&> writeWaiter;
  kj::Maybe<Waiter&> hangupWaiter;

  friend class Waiter;
};

// The kj::LowLevelAsyncIoProvider of an EventLoop. Belongs to the loop thread. getTimer() is the
// loop's timer (borrowed: real or manual), which must outlive this.
class UvLowLevelIo final : public kj::LowLevelAsyncIoProvider {
public:
  UvLowLevelIo(uv_loop_t* loop, kj::Timer& timer);

  kj::Own<kj::AsyncInputStream> wrapInputFd(int fd, uint flags = 0) override;
  kj::Own<kj::AsyncOutputStream> wrapOutputFd(int fd, uint flags = 0) override;
  kj::Own<kj::AsyncIoStream> wrapSocketFd(int fd, uint flags = 0) override;
  kj::Promise<kj::Own<kj::AsyncIoStream>> wrapConnectingSocketFd(int fd,
                                                                 const struct sockaddr* addr,
                                                                 uint addrlen,
                                                                 uint flags = 0) override;
  kj::Own<kj::ConnectionReceiver> wrapListenSocketFd(int fd, NetworkFilter& filter,
                                                     uint flags = 0) override;
  kj::Timer& getTimer() override;

  uv_loop_t* uvLoop() { return loop; }

private:
  uv_loop_t* loop;
  kj::Timer& timer;
};

}  // namespace troupe::base_detail
