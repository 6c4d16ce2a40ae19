#include "tests/chaos/replica_process.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <fstream>
#include <iterator>
#include <string>

#include <kj/debug.h>

namespace troupe::chaos {

namespace {

// The parent of process `pid` from /proc/<pid>/stat ("pid (comm) state ppid ..."; comm may
// hold spaces and parentheses, so the fields are read after its last ')'); 0 when it is gone.
pid_t parentOf(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto close = stat.rfind(')');
  if (close == std::string::npos) return 0;
  char state = 0;
  int parent = 0;
  if (sscanf(stat.c_str() + close + 1, " %c %d", &state, &parent) != 2) return 0;
  return parent;
}

}  // namespace

kj::Maybe<ReplicaProcess> ReplicaProcess::open(pid_t pid) {
  KJ_REQUIRE(pid > 0, "a replica's pid", pid);
  int fd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
  if (fd < 0) {
    KJ_REQUIRE(errno == ESRCH, "pidfd_open", pid, strerror(errno));
    return nullptr;
  }
  ReplicaProcess process(pid, kj::AutoCloseFd(fd));
  // Alive after the read, the process held `pid` throughout it: what was read is its own.
  if (parentOf(pid) != ::getpid() || !process.signal(0)) return nullptr;
  return kj::mv(process);
}

bool ReplicaProcess::signal(int signal) {
  if (::syscall(SYS_pidfd_send_signal, fd.get(), signal, nullptr, 0) == 0) return true;
  KJ_REQUIRE(errno == ESRCH, "pidfd_send_signal", pid_, signal, strerror(errno));
  return false;
}

}  // namespace troupe::chaos
