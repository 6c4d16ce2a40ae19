#include "tests/support/child_process.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <stdexcept>

extern char** environ;

namespace troupe::test {

namespace {

int64_t nowMs() {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t(ts.tv_sec) * 1000 + ts.tv_nsec / 1000000;
}

}  // namespace

ChildProcess::ChildProcess(const std::string& program, const std::vector<std::string>& args,
                           const std::vector<std::string>& env,
                           const ChildProcessOptions& options) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) throw std::runtime_error("pipe2 failed");
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, fds[1], STDOUT_FILENO);
  if (options.stderrToStdout) posix_spawn_file_actions_adddup2(&actions, fds[1], STDERR_FILENO);
  if (!options.workingDirectory.empty()) {
    posix_spawn_file_actions_addchdir_np(&actions, options.workingDirectory.c_str());
  }

  std::vector<std::string> argStrings{program};
  argStrings.insert(argStrings.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : argStrings) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);

  std::vector<std::string> envStrings;
  for (char** e = environ; *e != nullptr; ++e) envStrings.push_back(*e);
  envStrings.insert(envStrings.end(), env.begin(), env.end());
  std::vector<char*> envp;
  for (auto& e : envStrings) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);

  int rc = posix_spawn(&pid_, program.c_str(), &actions, nullptr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  close(fds[1]);
  if (rc != 0) {
    close(fds[0]);
    throw std::runtime_error("posix_spawn " + program + ": " + strerror(rc));
  }
  stdoutFd = fds[0];
}

ChildProcess::~ChildProcess() {
  if (!reaped && pid_ > 0) {
    ::kill(pid_, SIGKILL);
    waitpid(pid_, &status, 0);
  }
  if (stdoutFd >= 0) close(stdoutFd);
}

std::string ChildProcess::readLine(int timeoutMs) {
  int64_t deadline = nowMs() + timeoutMs;
  for (;;) {
    auto nl = buffer.find('\n');
    if (nl != std::string::npos) {
      std::string line = buffer.substr(0, nl);
      buffer.erase(0, nl + 1);
      return line;
    }
    int64_t left = deadline - nowMs();
    if (left <= 0 || stdoutFd < 0) return "";
    struct pollfd p = {stdoutFd, POLLIN, 0};
    int n = poll(&p, 1, static_cast<int>(left));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return "";
    char chunk[4096];
    ssize_t got = read(stdoutFd, chunk, sizeof(chunk));
    if (got <= 0) return "";
    buffer.append(chunk, got);
  }
}

void ChildProcess::kill(int signal) {
  if (!reaped) ::kill(pid_, signal);
}

bool ChildProcess::freeze() {
  if (reaped) return false;
  if (frozen) return true;  // its stop was reported already, and waitpid reports it only once
  ::kill(pid_, SIGSTOP);
  int got = 0;
  pid_t r;
  do {
    r = waitpid(pid_, &got, WUNTRACED);
  } while (r < 0 && errno == EINTR);
  if (r != pid_) throw std::runtime_error(std::string("waitpid: ") + strerror(errno));
  if (WIFSTOPPED(got)) {
    frozen = true;
    return true;
  }
  status = got;
  reaped = true;
  return false;
}

void ChildProcess::thaw() {
  if (reaped) return;
  ::kill(pid_, SIGCONT);
  frozen = false;
}

int ChildProcess::wait(int timeoutMs) {
  if (reaped) return status;
  // Woken by the exit itself (a pidfd turns readable when the process terminates), reading what
  // the child writes meanwhile so that it never blocks on a full pipe.
  int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, pid_, 0));
  if (pidfd < 0) throw std::runtime_error(std::string("pidfd_open: ") + strerror(errno));
  int64_t deadline = nowMs() + timeoutMs;
  int result = -1;
  for (;;) {
    int64_t left = deadline - nowMs();
    if (left <= 0) break;
    struct pollfd fds[2] = {{pidfd, POLLIN, 0}, {stdoutFd, POLLIN, 0}};
    int n = poll(fds, stdoutFd >= 0 ? 2 : 1, static_cast<int>(left));
    if (n <= 0) continue;  // EINTR, or the deadline
    if (fds[0].revents & POLLIN) {
      waitpid(pid_, &status, 0);
      reaped = true;
      result = status;
      break;
    }
    if (fds[1].revents & (POLLIN | POLLHUP | POLLERR)) {
      char chunk[4096];
      ssize_t got = read(stdoutFd, chunk, sizeof(chunk));
      if (got > 0) buffer.append(chunk, got);
      if (got == 0 || (got < 0 && errno != EINTR && errno != EAGAIN)) {
        close(stdoutFd);  // the end of its output (or a broken pipe); the exit follows
        stdoutFd = -1;
      }
    }
  }
  close(pidfd);
  return result;
}

}  // namespace troupe::test
