#pragma once
// Subprocess: one child process started with libuv's uv_spawn in a process group of its own,
// reaped by the loop, and never left behind.

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include <kj/async.h>

#include "troupe/base/uv_handle.h"

namespace troupe::jobs_detail {

// How a process ended: it exited with `code`, or a signal killed it.
struct ExitStatus {
  int64_t code = 0;  // the exit status, when it exited
  int signal = 0;    // the signal that killed it; 0 when it exited
  bool ok() const { return signal == 0 && code == 0; }
  bool operator==(const ExitStatus&) const = default;
};

// "exited with status 3", "was killed by signal 9 (SIGKILL)".
std::string describe(const ExitStatus& status);

struct SpawnOptions {
  // The program to execute. A name without '/' is taken relative to the current directory
  // ("./name"): PATH is never searched.
  std::string file;
  // argv, argv[0] included.
  std::vector<std::string> args;
  // The complete environment, "NAME=value" each.
  std::vector<std::string> env;
  // A file descriptor the child gets as its stdout and stderr (this object does not take it:
  // the caller closes its own copy); -1 = /dev/null. stdin is always /dev/null.
  int outputFd = -1;
};

// A running (or exited) child process. The child is the leader of a new session and process
// group (UV_PROCESS_DETACHED: setsid() before exec), so signalGroup() reaches every process it
// starts that stays in its group; it has no controlling terminal, so a terminal's Ctrl-C reaches
// only the launcher, which decides. Belongs to the loop thread that made it.
//
// When the child exits, libuv reaps it (waitpid on that pid only, from its SIGCHLD handler) and
// exited() resolves; whatever the child left running in its process group is then sent SIGKILL,
// so no descendant outlives it unless it left the group itself (setsid/setpgid).
class Subprocess {
public:
  // Starts the child. Throws FAILED naming the program and libuv's error ("no such file or
  // directory (ENOENT)", "permission denied (EACCES)") when it cannot be executed; then no
  // process is left (libuv reaps the failed child before returning).
  Subprocess(uv_loop_t* loop, const SpawnOptions& options);

  // A child still running is sent SIGKILL (with its whole process group) and reaped here,
  // blocking briefly; then the handle is closed.
  ~Subprocess() noexcept;
  KJ_DISALLOW_COPY(Subprocess);

  pid_t pid() const { return pid_; }

  // False once the child has exited and was reaped.
  bool running() const { return !exited_; }

  // Resolves with the exit status once the child has been reaped. May be called once; the
  // promise is fulfilled on the loop and may outlive this object (it then rejects).
  kj::Promise<ExitStatus> exited();

  // Sends `signum` to the child's process group while the child runs (nothing after it exited).
  void signalGroup(int signum);

private:
  static void onExit(uv_process_t* handle, int64_t code, int signal);

  UvHandle<uv_process_t> handle;
  pid_t pid_ = 0;
  bool exited_ = false;
  kj::Maybe<kj::Promise<ExitStatus>> exitPromise;
  kj::Own<kj::PromiseFulfiller<ExitStatus>> exitFulfiller;
};

}  // namespace troupe::jobs_detail
