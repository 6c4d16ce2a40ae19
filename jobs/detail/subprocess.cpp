#include "troupe/jobs/detail/subprocess.h"

#include <errno.h>
#include <signal.h>
#include <string.h>
#include <sys/wait.h>

#include <kj/debug.h>

namespace troupe::jobs_detail {

std::string describe(const ExitStatus& status) {
  if (status.signal != 0) {
    const char* name = sigabbrev_np(status.signal);
    return "was killed by signal " + std::to_string(status.signal) +
           (name != nullptr ? std::string(" (SIG") + name + ")" : std::string());
  }
  return "exited with status " + std::to_string(status.code);
}

Subprocess::Subprocess(uv_loop_t* loop, const SpawnOptions& options) {
  KJ_REQUIRE(!options.file.empty(), "Subprocess needs a program");
  std::string file = options.file.find('/') == std::string::npos ? "./" + options.file
                                                                 : options.file;
  std::vector<char*> argv;
  for (auto& a : options.args) argv.push_back(const_cast<char*>(a.c_str()));
  if (argv.empty()) argv.push_back(const_cast<char*>(options.file.c_str()));
  argv.push_back(nullptr);
  std::vector<char*> envp;
  for (auto& e : options.env) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);

  uv_stdio_container_t stdio[3];
  stdio[0].flags = UV_IGNORE;
  for (int i = 1; i <= 2; ++i) {
    if (options.outputFd >= 0) {
      stdio[i].flags = UV_INHERIT_FD;
      stdio[i].data.fd = options.outputFd;
    } else {
      stdio[i].flags = UV_IGNORE;
    }
  }

  uv_process_options_t spawn{};
  spawn.exit_cb = &Subprocess::onExit;
  spawn.file = file.c_str();
  spawn.args = argv.data();
  spawn.env = envp.data();
  spawn.flags = UV_PROCESS_DETACHED;
  spawn.stdio_count = 3;
  spawn.stdio = stdio;

  auto paf = kj::newPromiseAndFulfiller<ExitStatus>();
  exitPromise = kj::mv(paf.promise);
  exitFulfiller = kj::mv(paf.fulfiller);

  // uv_spawn initialises the handle even when it fails, and it must then be closed.
  handle.markInitialised();
  handle->data = this;
  int status = uv_spawn(loop, handle.get(), &spawn);
  if (status < 0) {
    kj::throwFatalException(
        kj::Exception(kj::Exception::Type::FAILED, __FILE__, __LINE__,
                      kj::str("cannot start '", file, "': ", uv_strerror(status), " (",
                              uv_err_name(status), ")")));
  }
  pid_ = handle->pid;
}

Subprocess::~Subprocess() noexcept {
  if (pid_ > 0 && !exited_) {
    // libuv has not reaped it (its exit callback would have run): nobody else will.
    ::kill(-pid_, SIGKILL);
    ::kill(pid_, SIGKILL);  // in case it is not (yet) its group's leader
    int status = 0;
    while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
    }
    exited_ = true;
  }
  handle.close();  // removes the handle from libuv's list of children to reap
}

kj::Promise<ExitStatus> Subprocess::exited() {
  KJ_IF_MAYBE(p, exitPromise) {
    auto promise = kj::mv(*p);
    exitPromise = nullptr;
    return promise;
  }
  KJ_FAIL_REQUIRE("Subprocess::exited() may be called once");
}

void Subprocess::signalGroup(int signum) {
  if (pid_ <= 0 || exited_) return;
  if (::kill(-pid_, signum) < 0 && errno == ESRCH) {
    // The child has not become a group leader yet (between fork and setsid): signal it alone.
    ::kill(pid_, signum);
  }
}

void Subprocess::onExit(uv_process_t* h, int64_t code, int signal) {
  auto* self = static_cast<Subprocess*>(h->data);
  if (self == nullptr) return;
  self->exited_ = true;
  // The group outlives its leader only through processes the child left behind: end them too.
  // The pid is not free for reuse while such processes hold it as their group id.
  ::kill(-self->pid_, SIGKILL);
  self->exitFulfiller->fulfill(ExitStatus{code, signal});
}

}  // namespace troupe::jobs_detail
