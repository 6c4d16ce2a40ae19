#pragma once
// A child process for multi-process tests: started with posix_spawn, its stdout read line by
// line, stopped (SIGKILL if need be) and reaped when the object goes.

#include <sys/types.h>

#include <string>
#include <vector>

namespace troupe::test {

struct ChildProcessOptions {
  // The directory the child starts in. Default "": ours.
  std::string workingDirectory;

  // Whether the child's stderr goes into the same pipe as its stdout (so readLine() returns
  // both, interleaved as the child wrote them). Default false: it writes to our stderr.
  bool stderrToStdout = false;
};

class ChildProcess {
public:
  // Starts `program` with `args`; extra environment entries ("NAME=value") are added to ours.
  // Throws std::runtime_error when it cannot be started (also for a working directory that does
  // not exist).
  ChildProcess(const std::string& program, const std::vector<std::string>& args,
               const std::vector<std::string>& env = {}, const ChildProcessOptions& options = {});
  ~ChildProcess();
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  // The next line the child printed, waiting up to `timeoutMs`; "" on timeout or end of output.
  std::string readLine(int timeoutMs = 10000);

  // Sends `signal`.
  void kill(int signal);

  // Sends SIGSTOP and returns once the child has stopped (as waitpid reports it): whatever it
  // wrote before is written, and it writes nothing more until thaw(). Returns false if it had
  // exited instead (it is reaped then). Waits without a bound, since a stop takes effect at once.
  bool freeze();

  // Sends SIGCONT: a frozen child runs on where it stopped.
  void thaw();

  // Waits up to `timeoutMs` for the child to exit and returns its wait status, or -1 on timeout.
  int wait(int timeoutMs = 10000);

  pid_t pid() const { return pid_; }
  bool running() const { return !reaped; }

private:
  pid_t pid_ = -1;
  int stdoutFd = -1;
  std::string buffer;
  bool reaped = false;
  bool frozen = false;
  int status = 0;
};

}  // namespace troupe::test
