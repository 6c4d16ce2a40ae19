#include "troupe/base/detail/uv_io.h"

#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <kj/io.h>
#include <kj/vector.h>

#include "troupe/base/detail/uv_event_port.h"
#include "troupe/base/errors.h"

namespace troupe::base_detail {

// ------------------------------------------------------------------------------------------------
// FdWatcher

class FdWatcher::Waiter {
public:
  Waiter(kj::PromiseFulfiller<void>& fulfiller, FdWatcher& watcher, kj::Maybe<Waiter&>& slot,
         int event)
      : fulfiller(fulfiller), slot(slot) {
    KJ_REQUIRE(slot == nullptr, "only one waiter of each kind at a time");
    watcher.want(event);  // may throw: take the slot only once interest is registered
    slot = *this;
  }
  ~Waiter() noexcept(false) {
    KJ_IF_MAYBE(current, slot) {
      if (current == this) slot = nullptr;
    }
  }
  void fire() {
    slot = nullptr;
    fulfiller.fulfill();
  }

private:
  kj::PromiseFulfiller<void>& fulfiller;
  kj::Maybe<Waiter&>& slot;
};

FdWatcher::FdWatcher(uv_loop_t* loop, int fd) {
  checkUv("uv_poll_init", uv_poll_init(loop, handle.get(), fd));
  handle.markInitialised();
  handle->data = this;
}

FdWatcher::~FdWatcher() noexcept {
  if (interest != 0) uv_poll_stop(handle.get());
  handle.close();
}

kj::Promise<void> FdWatcher::whenReadable() {
  return kj::newAdaptedPromise<void, Waiter>(*this, readWaiter, UV_READABLE);
}

kj::Promise<void> FdWatcher::whenWritable() {
  return kj::newAdaptedPromise<void, Waiter>(*this, writeWaiter, UV_WRITABLE);
}

kj::Promise<void> FdWatcher::whenHangup() {
  return kj::newAdaptedPromise<void, Waiter>(*this, hangupWaiter, UV_DISCONNECT);
}

void FdWatcher::want(int event) {
  if ((interest & event) == 0) setInterest(interest | event);
}

void FdWatcher::setInterest(int events) {
  if (events == interest) return;
  if (events == 0) {
    uv_poll_stop(handle.get());
  } else {
    checkUv("uv_poll_start", uv_poll_start(handle.get(), events, &FdWatcher::onPoll));
  }
  interest = events;
}

void FdWatcher::onPoll(uv_poll_t* handle, int status, int events) {
  auto* self = static_cast<FdWatcher*>(handle->data);
  if (self == nullptr) return;
  if (status < 0) {
    // The fd is in an error state: wake everyone so that their syscall reports the error.
    events = UV_READABLE | UV_WRITABLE | UV_DISCONNECT;
  }
  int keep = self->interest;
  auto dispatch = [&](int event, kj::Maybe<Waiter&>& slot) {
    if ((events & event) == 0) return;
    KJ_IF_MAYBE(waiter, slot) {
      waiter->fire();
    } else {
      keep &= ~event;
    }
  };
  dispatch(UV_READABLE, self->readWaiter);
  dispatch(UV_WRITABLE, self->writeWaiter);
  dispatch(UV_DISCONNECT, self->hangupWaiter);
  if (status < 0) keep = 0;
  self->setInterest(keep);
}

// ------------------------------------------------------------------------------------------------
// Streams

namespace {

void setNonblockingCloexec(int fd, uint flags) {
  if (!(flags & kj::LowLevelAsyncIoProvider::ALREADY_NONBLOCK)) {
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0) {
      kj::throwFatalException(syscallException("fcntl(O_NONBLOCK)", errno));
    }
  }
  if ((flags & kj::LowLevelAsyncIoProvider::TAKE_OWNERSHIP) &&
      !(flags & kj::LowLevelAsyncIoProvider::ALREADY_CLOEXEC)) {
    int fl = fcntl(fd, F_GETFD);
    if (fl < 0 || fcntl(fd, F_SETFD, fl | FD_CLOEXEC) < 0) {
      kj::throwFatalException(syscallException("fcntl(FD_CLOEXEC)", errno));
    }
  }
}

// The socket calls kj's stream and listener interfaces both pass through, with kj's argument
// types and troupe's errors.
namespace sockopt {

void get(int fd, int level, int option, void* value, uint* length) {
  socklen_t len = *length;
  if (::getsockopt(fd, level, option, value, &len) < 0) {
    kj::throwFatalException(syscallException("getsockopt", errno));
  }
  *length = len;
}

void set(int fd, int level, int option, const void* value, uint length) {
  if (::setsockopt(fd, level, option, value, length) < 0) {
    kj::throwFatalException(syscallException("setsockopt", errno));
  }
}

void name(int fd, struct sockaddr* addr, uint* length) {
  socklen_t len = *length;
  if (::getsockname(fd, addr, &len) < 0) {
    kj::throwFatalException(syscallException("getsockname", errno));
  }
  *length = len;
}

}  // namespace sockopt

class OwnedFd {
public:
  OwnedFd(int fd, uint flags) : fd(fd), owned(flags & kj::LowLevelAsyncIoProvider::TAKE_OWNERSHIP) {
    setNonblockingCloexec(fd, flags);
  }
  ~OwnedFd() noexcept {
    if (owned) ::close(fd);
  }
  KJ_DISALLOW_COPY(OwnedFd);

  const int fd;

private:
  bool owned;
};

bool isSocket(int fd) {
  int type;
  socklen_t len = sizeof(type);
  return ::getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) == 0;
}

// Descriptors received with a read (SCM_RIGHTS), for tryReadWithFds().
struct FdSink {
  kj::AutoCloseFd* buffer;
  size_t max;
  size_t count = 0;
};

// One stream over a non-blocking fd. The watcher is declared after the fd so that it stops
// polling before the fd is closed. Over a unix socket it also carries file descriptors
// (writeWithFds(), tryReadWithFds()); streams of streams it does not.
class UvStream final : public kj::AsyncCapabilityStream {
public:
  UvStream(uv_loop_t* loop, int fd, uint flags)
      : ownedFd(fd, flags), fd(fd), socket(isSocket(fd)), watcher(loop, fd) {}

  kj::Promise<size_t> tryRead(void* buffer, size_t minBytes, size_t maxBytes) override {
    return readSome(static_cast<kj::byte*>(buffer), minBytes, maxBytes, nullptr);
  }

  kj::Promise<ReadResult> tryReadWithFds(void* buffer, size_t minBytes, size_t maxBytes,
                                         kj::AutoCloseFd* fdBuffer, size_t maxFds) override {
    // One read at a time (kj's contract): the stream's own sink, no allocation per read.
    readSink = FdSink{fdBuffer, maxFds};
    return readSome(static_cast<kj::byte*>(buffer), minBytes, maxBytes, &readSink)
        .then([this](size_t n) {
          return ReadResult{n, readSink.count};
        });
  }

  kj::Promise<void> write(const void* buffer, size_t size) override {
    kj::ArrayPtr<const kj::byte> piece(static_cast<const kj::byte*>(buffer), size);
    return writeLoop(piece, nullptr, nullptr);
  }

  kj::Promise<void> write(kj::ArrayPtr<const kj::ArrayPtr<const kj::byte>> pieces) override {
    if (pieces.size() == 0) return kj::READY_NOW;
    return writeLoop(pieces[0], pieces.slice(1, pieces.size()), nullptr);
  }

  // The descriptors go with the first bytes written; `fds` must stay valid until then.
  kj::Promise<void> writeWithFds(kj::ArrayPtr<const kj::byte> data,
                                 kj::ArrayPtr<const kj::ArrayPtr<const kj::byte>> moreData,
                                 kj::ArrayPtr<const int> fds) override {
    KJ_REQUIRE(data.size() > 0, "descriptors need at least one byte to go with");
    return writeLoop(data, moreData, fds);
  }

  kj::Promise<void> writeWithStreams(kj::ArrayPtr<const kj::byte>,
                                     kj::ArrayPtr<const kj::ArrayPtr<const kj::byte>>,
                                     kj::Array<kj::Own<kj::AsyncCapabilityStream>>) override {
    KJ_UNIMPLEMENTED("troupe's streams carry file descriptors, not streams");
  }

  kj::Promise<ReadResult> tryReadWithStreams(void*, size_t, size_t,
                                             kj::Own<kj::AsyncCapabilityStream>*, size_t) override {
    KJ_UNIMPLEMENTED("troupe's streams carry file descriptors, not streams");
  }

  kj::Promise<void> whenWriteDisconnected() override {
    KJ_IF_MAYBE(fork, hangup) {
      return fork->addBranch();
    }
    auto fork = watcher.whenHangup().fork();
    auto branch = fork.addBranch();
    hangup = kj::mv(fork);
    return branch;
  }

  void shutdownWrite() override {
    if (::shutdown(fd, SHUT_WR) < 0 && errno != ENOTCONN) {
      kj::throwFatalException(syscallException("shutdown(SHUT_WR)", errno));
    }
  }

  void abortRead() override {
    if (::shutdown(fd, SHUT_RD) < 0 && errno != ENOTCONN) {
      kj::throwFatalException(syscallException("shutdown(SHUT_RD)", errno));
    }
  }

  void getsockopt(int level, int option, void* value, uint* length) override {
    sockopt::get(fd, level, option, value, length);
  }

  void setsockopt(int level, int option, const void* value, uint length) override {
    sockopt::set(fd, level, option, value, length);
  }

  void getsockname(struct sockaddr* addr, uint* length) override {
    sockopt::name(fd, addr, length);
  }

  void getpeername(struct sockaddr* addr, uint* length) override {
    socklen_t len = *length;
    if (::getpeername(fd, addr, &len) < 0) {
      kj::throwFatalException(syscallException("getpeername", errno));
    }
    *length = len;
  }

  kj::Maybe<int> getFd() const override { return fd; }

  kj::Promise<void> whenConnected() {
    // A non-blocking connect() completes when the socket becomes writable; SO_ERROR says how.
    return watcher.whenWritable().then([this]() {
      int err = 0;
      socklen_t len = sizeof(err);
      if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) < 0) err = errno;
      if (err != 0) kj::throwFatalException(syscallException("connect", err));
    });
  }

private:
  kj::Promise<size_t> readSome(kj::byte* bytes, size_t minBytes, size_t maxBytes, FdSink* fds) {
    if (drained) {
      // The last read emptied the socket: wait for more instead of a read() that would only
      // say EAGAIN (one syscall fewer per message when messages come one at a time). Polling
      // is level-triggered, so bytes that came meanwhile wake the wait at once.
      drained = false;
      return watcher.whenReadable().then([this, bytes, minBytes, maxBytes, fds]() {
        return readLoop(bytes, minBytes, maxBytes, 0, fds);
      });
    }
    return readLoop(bytes, minBytes, maxBytes, 0, fds);
  }

  // One read; with `fds`, a recvmsg() that keeps the descriptors sent with the bytes (those past
  // the sink's room are closed).
  ssize_t readOnce(kj::byte* buffer, size_t maxBytes, FdSink* fds) {
    if (fds == nullptr) return ::read(fd, buffer, maxBytes);
    struct iovec iov = {buffer, maxBytes};
    alignas(struct cmsghdr) char control[CMSG_SPACE(sizeof(int) * 16)];
    struct msghdr msg;
    memset(&msg, 0, sizeof(msg));
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    ssize_t n = ::recvmsg(fd, &msg, MSG_CMSG_CLOEXEC);
    if (n < 0) return n;
    for (auto* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
      if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
      size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (size_t i = 0; i < count; ++i) {
        int received;
        memcpy(&received, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
        kj::AutoCloseFd owned(received);
        if (fds->count < fds->max) fds->buffer[fds->count++] = kj::mv(owned);
      }
    }
    return n;
  }

  kj::Promise<size_t> readLoop(kj::byte* buffer, size_t minBytes, size_t maxBytes, size_t already,
                               FdSink* fds) {
    for (;;) {
      ssize_t n = readOnce(buffer, maxBytes, fds);
      if (n < 0) {
        int error = errno;
        if (error == EINTR) continue;
        if (error == EAGAIN || error == EWOULDBLOCK) {
          return watcher.whenReadable().then([this, buffer, minBytes, maxBytes, already, fds]() {
            return readLoop(buffer, minBytes, maxBytes, already, fds);
          });
        }
        return syscallException("read", error);
      }
      if (n == 0) return already;  // end of stream
      already += n;
      buffer += n;
      maxBytes -= n;
      if (static_cast<size_t>(n) >= minBytes) {
        // A short read from a socket took all it had (a full one may have left more).
        drained = socket && maxBytes > 0;
        return already;
      }
      minBytes -= n;
    }
  }

  // `fds` go with the first bytes written (socket only).
  kj::Promise<void> writeLoop(kj::ArrayPtr<const kj::byte> first,
                              kj::ArrayPtr<const kj::ArrayPtr<const kj::byte>> rest,
                              kj::ArrayPtr<const int> fds) {
    for (;;) {
      constexpr size_t MAX_IOV = 64;
      struct iovec iov[MAX_IOV];
      size_t count = 0;
      iov[count++] = {const_cast<kj::byte*>(first.begin()), first.size()};
      for (size_t i = 0; i < rest.size() && count < MAX_IOV; ++i) {
        iov[count++] = {const_cast<kj::byte*>(rest[i].begin()), rest[i].size()};
      }
      ssize_t n;
      if (socket) {
        struct msghdr msg;
        memset(&msg, 0, sizeof(msg));
        msg.msg_iov = iov;
        msg.msg_iovlen = count;
        alignas(struct cmsghdr) char control[CMSG_SPACE(sizeof(int) * 16)];
        if (fds.size() > 0) {
          KJ_REQUIRE(fds.size() <= 16, "too many descriptors in one write", fds.size());
          msg.msg_control = control;
          msg.msg_controllen = CMSG_SPACE(sizeof(int) * fds.size());
          auto* c = CMSG_FIRSTHDR(&msg);
          c->cmsg_level = SOL_SOCKET;
          c->cmsg_type = SCM_RIGHTS;
          c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
          memcpy(CMSG_DATA(c), fds.begin(), sizeof(int) * fds.size());
        }
        n = ::sendmsg(fd, &msg, MSG_NOSIGNAL);
      } else {
        KJ_REQUIRE(fds.size() == 0, "descriptors can only go over a unix socket");
        n = ::writev(fd, iov, count);
      }
      if (n < 0) {
        int error = errno;
        if (error == EINTR) continue;
        if (error == EAGAIN || error == EWOULDBLOCK) {
          return watcher.whenWritable().then(
              [this, first, rest, fds]() { return writeLoop(first, rest, fds); });
        }
        return syscallException("write", error);
      }
      fds = nullptr;  // gone with the bytes written
      // Discard what was written.
      size_t written = n;
      while (written > 0 || first.size() == 0) {
        if (written < first.size()) {
          first = first.slice(written, first.size());
          written = 0;
          break;
        }
        written -= first.size();
        if (rest.size() == 0) return kj::READY_NOW;
        first = rest[0];
        rest = rest.slice(1, rest.size());
      }
    }
  }

  OwnedFd ownedFd;
  const int fd;
  const bool socket;
  FdWatcher watcher;
  kj::Maybe<kj::ForkedPromise<void>> hangup;
  bool drained = false;         // the last read ended short: the socket had nothing more
  FdSink readSink{nullptr, 0};  // the descriptors of the read in flight (tryReadWithFds())
};

class UvListener final : public kj::ConnectionReceiver {
public:
  UvListener(uv_loop_t* loop, int fd, kj::LowLevelAsyncIoProvider::NetworkFilter& filter,
             uint flags)
      : loop(loop), ownedFd(fd, flags), fd(fd), filter(filter), watcher(loop, fd) {}

  kj::Promise<kj::Own<kj::AsyncIoStream>> accept() override {
    for (;;) {
      struct sockaddr_storage addr;
      socklen_t addrlen = sizeof(addr);
      int newFd = ::accept4(fd, reinterpret_cast<struct sockaddr*>(&addr), &addrlen,
                            SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (newFd >= 0) {
        if (!filter.shouldAllow(reinterpret_cast<struct sockaddr*>(&addr), addrlen)) {
          ::close(newFd);
          continue;
        }
        if (addr.ss_family == AF_INET || addr.ss_family == AF_INET6) {
          int one = 1;
          ::setsockopt(newFd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        }
        return kj::Own<kj::AsyncIoStream>(
            kj::heap<UvStream>(loop, newFd,
                               kj::LowLevelAsyncIoProvider::TAKE_OWNERSHIP |
                                   kj::LowLevelAsyncIoProvider::ALREADY_CLOEXEC |
                                   kj::LowLevelAsyncIoProvider::ALREADY_NONBLOCK));
      }
      int error = errno;
      switch (error) {
        case EAGAIN:
#if EAGAIN != EWOULDBLOCK
        case EWOULDBLOCK:
#endif
          return watcher.whenReadable().then([this]() { return accept(); });
        case EINTR:
        case ECONNABORTED:
        case EPROTO:
        case ENETDOWN:
        case ENOPROTOOPT:
        case EHOSTDOWN:
        case ENONET:
        case EHOSTUNREACH:
        case EOPNOTSUPP:
        case ENETUNREACH:
          // The connection died before we accepted it; take the next one.
          continue;
        default:
          return syscallException("accept", error);
      }
    }
  }

  uint getPort() override {
    struct sockaddr_storage addr;
    socklen_t len = sizeof(addr);
    if (::getsockname(fd, reinterpret_cast<struct sockaddr*>(&addr), &len) < 0) {
      kj::throwFatalException(syscallException("getsockname", errno));
    }
    switch (addr.ss_family) {
      case AF_INET:
        return ntohs(reinterpret_cast<struct sockaddr_in*>(&addr)->sin_port);
      case AF_INET6:
        return ntohs(reinterpret_cast<struct sockaddr_in6*>(&addr)->sin6_port);
      default:
        return 0;
    }
  }

  void getsockopt(int level, int option, void* value, uint* length) override {
    sockopt::get(fd, level, option, value, length);
  }

  void setsockopt(int level, int option, const void* value, uint length) override {
    sockopt::set(fd, level, option, value, length);
  }

  void getsockname(struct sockaddr* addr, uint* length) override {
    sockopt::name(fd, addr, length);
  }

private:
  uv_loop_t* loop;
  OwnedFd ownedFd;
  const int fd;
  kj::LowLevelAsyncIoProvider::NetworkFilter& filter;
  FdWatcher watcher;
};

}  // namespace

// ------------------------------------------------------------------------------------------------
// UvLowLevelIo

UvLowLevelIo::UvLowLevelIo(uv_loop_t* loop, kj::Timer& timer) : loop(loop), timer(timer) {}

kj::Own<kj::AsyncInputStream> UvLowLevelIo::wrapInputFd(int fd, uint flags) {
  return kj::heap<UvStream>(loop, fd, flags);
}

kj::Own<kj::AsyncOutputStream> UvLowLevelIo::wrapOutputFd(int fd, uint flags) {
  return kj::heap<UvStream>(loop, fd, flags);
}

kj::Own<kj::AsyncIoStream> UvLowLevelIo::wrapSocketFd(int fd, uint flags) {
  return kj::heap<UvStream>(loop, fd, flags);
}

kj::Promise<kj::Own<kj::AsyncIoStream>> UvLowLevelIo::wrapConnectingSocketFd(
    int fd, const struct sockaddr* addr, uint addrlen, uint flags) {
  // Wrap first so that the fd is owned (and closed) whatever happens next.
  auto stream = kj::heap<UvStream>(loop, fd, flags);
  for (;;) {
    if (::connect(fd, addr, addrlen) == 0) {
      return kj::Own<kj::AsyncIoStream>(kj::mv(stream));
    }
    int error = errno;
    if (error == EINTR) continue;
    if (error == EINPROGRESS) break;
    return syscallException("connect", error);
  }
  auto& ref = *stream;
  return ref.whenConnected().then(
      [stream = kj::mv(stream)]() mutable -> kj::Own<kj::AsyncIoStream> { return kj::mv(stream); });
}

kj::Own<kj::ConnectionReceiver> UvLowLevelIo::wrapListenSocketFd(int fd, NetworkFilter& filter,
                                                                 uint flags) {
  return kj::heap<UvListener>(loop, fd, filter, flags);
}

kj::Timer& UvLowLevelIo::getTimer() { return timer; }

}  // namespace troupe::base_detail
