#include "troupe/net/listen_socket.h"

#include <errno.h>
#include <netdb.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <kj/debug.h>

#include "troupe/base/errors.h"

namespace troupe {

namespace {

constexpr int BACKLOG = 1024;

class FdGuard {
public:
  explicit FdGuard(int fd) : fd(fd) {}
  ~FdGuard() {
    if (fd >= 0) ::close(fd);
  }
  int release() {
    int f = fd;
    fd = -1;
    return f;
  }
  int get() const { return fd; }

private:
  int fd;
};

[[noreturn]] void failBind(const Address& address, int error) {
  auto text = address.toString();
  if (error == EADDRINUSE) {
    throwError(ErrorCode::ADDRESS_IN_USE,
               kj::str("cannot listen on ", text, ": address already in use"));
  }
  throwError(ErrorCode::INVALID_ARGUMENT,
             kj::str("cannot listen on ", text, ": ", strerror(error)));
}

kj::Own<kj::ConnectionReceiver> wrap(kj::LowLevelAsyncIoProvider& io, FdGuard& fd) {
  return io.wrapListenSocketFd(fd.release(), kj::LowLevelAsyncIoProvider::TAKE_OWNERSHIP |
                                                 kj::LowLevelAsyncIoProvider::ALREADY_CLOEXEC |
                                                 kj::LowLevelAsyncIoProvider::ALREADY_NONBLOCK);
}

ListenSocket listenTcp(kj::LowLevelAsyncIoProvider& io, const Address& address) {
  struct addrinfo hints;
  memset(&hints, 0, sizeof(hints));
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV | AI_ADDRCONFIG;
  struct addrinfo* found = nullptr;
  auto port = std::to_string(address.port);
  int rc = getaddrinfo(address.host.c_str(), port.c_str(), &hints, &found);
  if (rc != 0 || found == nullptr) {
    throwError(ErrorCode::INVALID_ARGUMENT,
               kj::str("cannot listen on ", address.toString(), ": ",
                       rc == EAI_SYSTEM ? strerror(errno) : gai_strerror(rc)));
  }
  KJ_DEFER(freeaddrinfo(found));

  FdGuard fd(::socket(found->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (fd.get() < 0) failBind(address, errno);
  int one = 1;
  ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (::bind(fd.get(), found->ai_addr, found->ai_addrlen) < 0) failBind(address, errno);
  if (::listen(fd.get(), BACKLOG) < 0) failBind(address, errno);

  struct sockaddr_storage bound;
  socklen_t len = sizeof(bound);
  ListenSocket result;
  result.bound = address;
  if (::getsockname(fd.get(), reinterpret_cast<struct sockaddr*>(&bound), &len) == 0) {
    if (bound.ss_family == AF_INET) {
      result.bound.port = ntohs(reinterpret_cast<struct sockaddr_in*>(&bound)->sin_port);
    } else if (bound.ss_family == AF_INET6) {
      result.bound.port = ntohs(reinterpret_cast<struct sockaddr_in6*>(&bound)->sin6_port);
    }
  }
  result.receiver = wrap(io, fd);
  return result;
}

// True if something accepts connections on the unix socket at `path`.
bool unixSocketAlive(const struct sockaddr_un& addr) {
  FdGuard probe(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (probe.get() < 0) return false;
  return ::connect(probe.get(), reinterpret_cast<const struct sockaddr*>(&addr), sizeof(addr)) == 0;
}

ListenSocket listenUnix(kj::LowLevelAsyncIoProvider& io, const Address& address) {
  struct sockaddr_un addr;
  memset(&addr, 0, sizeof(addr));
  addr.sun_family = AF_UNIX;
  KJ_REQUIRE(address.path.size() < sizeof(addr.sun_path));
  memcpy(addr.sun_path, address.path.data(), address.path.size());

  struct stat st;
  if (::lstat(address.path.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) {
      throwError(ErrorCode::ADDRESS_IN_USE, kj::str("cannot listen on ", address.toString(),
                                                    ": the path exists and is not a socket"));
    }
    if (unixSocketAlive(addr)) failBind(address, EADDRINUSE);
    ::unlink(address.path.c_str());  // stale: its server is gone
  }

  FdGuard fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (fd.get() < 0) failBind(address, errno);
  if (::bind(fd.get(), reinterpret_cast<struct sockaddr*>(&addr), sizeof(addr)) < 0) {
    failBind(address, errno);
  }
  if (::listen(fd.get(), BACKLOG) < 0) {
    int error = errno;
    ::unlink(address.path.c_str());
    failBind(address, error);
  }
  ListenSocket result;
  result.bound = address;
  result.ownsPath = true;
  result.receiver = wrap(io, fd);
  return result;
}

}  // namespace

ListenSocket openListenSocket(kj::LowLevelAsyncIoProvider& io, const Address& address) {
  return address.kind == Address::Kind::UNIX ? listenUnix(io, address) : listenTcp(io, address);
}

void removeSocketFile(const Address& address) {
  if (address.kind == Address::Kind::UNIX) ::unlink(address.path.c_str());
}

}  // namespace troupe
