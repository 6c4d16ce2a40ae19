#pragma once
// Helpers for the launcher tests: a temporary directory, a FIFO replicas report to, waiting for
// a process (not necessarily our child) to be gone, and a recorder of a job's phases.

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <kj/async-io.h>
#include <kj/debug.h>
#include <kj/io.h>

#include "troupe/base/event_loop.h"
#include "troupe/jobs/launcher.h"
#include "troupe/pool/actor_pool.h"
#include "tests/support/test_actors.h"

namespace troupe::test {

// A job of `replicas` replicas, each needing `cpus` cores and 64 MiB.
inline JobRequest jobRequest(std::string name, Entrypoint entrypoint, uint32_t replicas = 1,
                             double cpus = 1) {
  return JobRequest{.name = kj::mv(name),
                    .entrypoint = kj::mv(entrypoint),
                    .resources = ResourceConfig::withCpu(cpus, "64m"),
                    .replicas = replicas};
}

// The lines of the job's logs (all of them) that contain `text`.
inline std::vector<std::string> grepLogs(const JobHandle& job, const std::string& text) {
  std::vector<std::string> out;
  for (auto& line : job.logs(1000)) {
    if (line.find(text) != std::string::npos) out.push_back(line);
  }
  return out;
}

// The names the members of `pool` answer whoami with, one broadcast, waiting at most `limit`;
// a member that fails is a test failure.
inline std::set<std::string> memberNames(EventLoop& loop, ActorPool<Member>& pool,
                                         kj::Duration limit) {
  auto results = pool.broadcast([](Member::Client c) { return c.whoamiRequest().send(); })
                     .waitAll(limit)
                     .wait(loop.waitScope());
  std::set<std::string> names;
  for (auto& r : results) {
    KJ_IF_MAYBE(v, r.value) {
      names.insert(v->getName().cStr());
    } else {
      ADD_FAILURE() << "member " << r.endpoint.name << " failed";
    }
  }
  return names;
}

// A fresh directory under /tmp (short, so a unix socket fits in it), removed with everything in
// it when this goes.
struct TempDir {
  TempDir() {
    char pattern[] = "/tmp/troupe-jobs-XXXXXX";
    if (mkdtemp(pattern) == nullptr) throw std::runtime_error("mkdtemp failed");
    path = pattern;
  }
  ~TempDir() {
    nftw(
        path.c_str(),
        [](const char* p, const struct stat*, int, struct FTW*) { return ::remove(p); }, 16,
        FTW_DEPTH | FTW_PHYS);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string path;
};

// A FIFO at <dir>/notify that replicas write lines to (TROUPE_TEST_NOTIFY), read on the loop.
// The FIFO stays open for writing here too, so that it never reports end of file between
// writers.
class NotifyFifo {
public:
  NotifyFifo(EventLoop& loop, const std::string& dir) : path(dir + "/notify") {
    if (mkfifo(path.c_str(), 0600) != 0) throw std::runtime_error("mkfifo failed");
    int readFd = open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (readFd < 0) throw std::runtime_error("cannot open the FIFO for reading");
    keepOpen = kj::AutoCloseFd(open(path.c_str(), O_WRONLY | O_CLOEXEC));
    input = loop.lowLevelIo().wrapInputFd(readFd, kj::LowLevelAsyncIoProvider::TAKE_OWNERSHIP);
  }

  // "TROUPE_TEST_NOTIFY=<path>", for a request's environment.
  std::pair<std::string, std::string> variable() const { return {"TROUPE_TEST_NOTIFY", path}; }

  // The next line written to the FIFO.
  kj::Promise<std::string> readLine() {
    auto nl = buffer.find('\n');
    if (nl != std::string::npos) {
      auto line = buffer.substr(0, nl);
      buffer.erase(0, nl + 1);
      return line;
    }
    return input->tryRead(chunk, 1, sizeof(chunk)).then([this](size_t n) {
      buffer.append(chunk, n);
      return readLine();
    });
  }

  std::string path;

private:
  kj::AutoCloseFd keepOpen{nullptr};
  kj::Own<kj::AsyncInputStream> input;
  std::string buffer;
  char chunk[512];
};

// Whether our reaped child `pid` is gone: kill(pid, 0) fails with ESRCH.
inline bool gone(pid_t pid) { return ::kill(pid, 0) == -1 && errno == ESRCH; }

// Waits up to `timeoutMs` for process `pid` (which need not be our child) to exit, through a
// pidfd (readable once the process has terminated, zombie or reaped). True when it has.
inline bool waitGone(pid_t pid, int timeoutMs = 10000) {
  int fd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
  if (fd < 0) return errno == ESRCH;
  struct pollfd p = {fd, POLLIN, 0};
  int n;
  do {
    n = ::poll(&p, 1, timeoutMs);
  } while (n < 0 && errno == EINTR);
  ::close(fd);
  return n > 0;
}

// Records the distinct phases a job goes through, from the moment it is made.
class PhaseRecorder {
public:
  explicit PhaseRecorder(JobHandle job) : job(kj::mv(job)) {
    phases.push_back(this->job.status());
    watching = watch().eagerlyEvaluate(nullptr);
  }

  // "pending,running,succeeded".
  std::string text() const {
    std::string out;
    for (auto p : phases) out += (out.empty() ? "" : ",") + std::string(toString(p).cStr());
    return out;
  }

private:
  kj::Promise<void> watch() {
    if (isFinal(phases.back())) return kj::READY_NOW;
    return job.whenChanged().then([this]() {
      if (job.status() != phases.back()) phases.push_back(job.status());
      return watch();
    });
  }

  JobHandle job;
  std::vector<JobPhase> phases;
  kj::Promise<void> watching = nullptr;
};

}  // namespace troupe::test
