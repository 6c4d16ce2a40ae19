#include "troupe/net/same_host.h"

#include <dirent.h>
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <fstream>

#include <kj/debug.h>

#include "troupe/base/parse_number.h"

namespace troupe {

std::string sameHostId() {
  std::string boot;
  std::ifstream("/proc/sys/kernel/random/boot_id") >> boot;
  struct stat ns;
  if (boot.empty() || ::stat("/proc/self/ns/net", &ns) != 0) return "";
  return boot + "/" + std::to_string(ns.st_ino);
}

kj::Maybe<pid_t> sameUserUnixPeer(int fd) {
  sockaddr_storage addr;
  socklen_t len = sizeof(addr);
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0 ||
      addr.ss_family != AF_UNIX) {
    return nullptr;
  }
  ucred cred;
  socklen_t credLen = sizeof(cred);
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &credLen) != 0) return nullptr;
  if (cred.uid != ::geteuid()) return nullptr;
  return cred.pid;
}

bool LocalPeer::exited() const {
  struct pollfd ready = {pidfd.get(), POLLIN, 0};
  int n;
  do {
    n = ::poll(&ready, 1, 0);
  } while (n < 0 && errno == EINTR);
  // A pidfd reads as ready once its process exited; one that cannot be polled is taken as gone.
  return n != 0 && (n < 0 || (ready.revents & (POLLIN | POLLERR | POLLHUP | POLLNVAL)) != 0);
}

std::shared_ptr<const LocalPeer> localPeerOf(int fd) {
  pid_t pid = 0;
  KJ_IF_MAYBE(p, sameUserUnixPeer(fd)) {
    pid = *p;
  }
  if (pid <= 0) return nullptr;
  auto peer = std::make_shared<LocalPeer>();
  peer->pid = pid;
  constexpr int PEER_PIDFD = 77;  // SO_PEERPIDFD (Linux 6.5), which older headers lack
  int pidfd = -1;
  socklen_t len = sizeof(pidfd);
  if (::getsockopt(fd, SOL_SOCKET, PEER_PIDFD, &pidfd, &len) != 0 || pidfd < 0) {
#if defined(SYS_pidfd_open)
    pidfd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
#endif
    if (pidfd < 0) return nullptr;
  }
  peer->pidfd = kj::AutoCloseFd(pidfd);
  if (peer->exited()) return nullptr;
  return peer;
}

std::string sameHostSocketDir() {
  const char* runtime = getenv("XDG_RUNTIME_DIR");
  std::string dir = runtime != nullptr && runtime[0] == '/'
                        ? std::string(runtime) + "/troupe"
                        : "/tmp/troupe-" + std::to_string(::getuid());
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    KJ_FAIL_REQUIRE("cannot make the directory of same-host sockets", dir, strerror(errno));
  }
  struct stat st;
  if (::lstat(dir.c_str(), &st) != 0) {
    KJ_FAIL_REQUIRE("cannot read the directory of same-host sockets", dir, strerror(errno));
  }
  if (!S_ISDIR(st.st_mode) || st.st_uid != ::getuid() || (st.st_mode & 077) != 0) {
    KJ_FAIL_REQUIRE(
        "the directory of same-host sockets is not a directory only this user can enter; "
        "same-host sockets are off",
        dir);
  }
  return dir;
}

size_t removeStaleSockets(const std::string& dir, size_t most) {
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return 0;
  size_t removed = 0;
  size_t seen = 0;
  while (auto* entry = ::readdir(d)) {
    if (++seen > most) break;
    // <incarnation in hex>-<pid>.sock, as sameHostSocketName() makes them.
    std::string name = entry->d_name;
    auto dash = name.rfind('-');
    if (dash == std::string::npos || name.size() < dash + 7 ||
        name.compare(name.size() - 5, 5, ".sock") != 0) {
      continue;
    }
    auto digits = kj::arrayPtr(name.data() + dash + 1, name.size() - 5 - dash - 1);
    KJ_IF_MAYBE(pid, parseWholeNumber(digits, INT32_MAX)) {
      // Asked of the process, not of the socket: connecting would disturb a live server.
      if (*pid == 0 || ::kill(static_cast<pid_t>(*pid), 0) == 0 || errno != ESRCH) continue;
    } else {
      continue;
    }
    auto path = dir + "/" + name;
    if (isOwnSocket(path) && ::unlink(path.c_str()) == 0) ++removed;
  }
  ::closedir(d);
  return removed;
}

std::string sameHostSocketName(uint64_t incarnation) {
  char name[64];
  snprintf(name, sizeof(name), "%llx-%d.sock", static_cast<unsigned long long>(incarnation),
           static_cast<int>(::getpid()));
  return name;
}

bool isOwnSocket(const std::string& path) {
  struct stat st;
  return ::lstat(path.c_str(), &st) == 0 && S_ISSOCK(st.st_mode) && st.st_uid == ::getuid();
}

}  // namespace troupe
