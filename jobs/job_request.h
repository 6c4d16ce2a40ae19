#pragma once
// JobRequest: what a job is (its name, what each replica runs, what it needs) and Entrypoints,
// the functions a program offers to run as replicas of its own jobs.

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <kj/common.h>
#include <kj/string.h>

#include "troupe/jobs/resource_config.h"

namespace troupe {

class EventLoop;

// What each replica of a job runs.
struct Entrypoint {
  enum class Kind : uint8_t { BINARY, FUNCTION };

  Kind kind = Kind::BINARY;
  std::string path;               // BINARY: the program to execute (PATH is not searched)
  std::string functionName;       // FUNCTION: the name it was registered under in Entrypoints
  std::vector<std::string> args;  // arguments (after argv[0])

  // Runs `path` with `args` in each replica.
  static Entrypoint binary(std::string path, std::vector<std::string> args = {});

  // Runs the function registered as `name` in this very program (see Entrypoints): the
  // launcher starts the program again as each replica, and the replica runs that function.
  static Entrypoint function(std::string name, std::vector<std::string> args = {});

  bool operator==(const Entrypoint&) const = default;
};

// A plain value describing a job.
struct JobRequest {
  // The job's name, which is also its job id: letters, digits, '.', '_', '-' (no spaces or
  // slashes), starting with a letter or digit, at most MAX_NAME_LENGTH bytes.
  std::string name;
  Entrypoint entrypoint;
  ResourceConfig resources;
  // Extra environment for every replica; it wins over what the launcher and the device set.
  std::map<std::string, std::string> environment;
  // How many replicas; 0 (the default) means resources.replicas.
  uint32_t replicas = 0;
  // How many times, in total across its replicas, a replica that fails (exits non-zero or is
  // killed by a signal) is started again before the job FAILS. Default 0.
  uint32_t maxRetriesFailure = 0;
  // Take over a live job of the same name (see Launcher::submit) instead of being refused.
  bool adopt = false;

  // The replica count in effect.
  uint32_t replicaCount() const { return replicas != 0 ? replicas : resources.replicas; }

  // Throws INVALID_ARGUMENT saying what is wrong: a bad name, an empty binary path or function
  // name, bad resources (ResourceConfig::validate()), an environment variable name that is
  // empty or holds '=' or a control character.
  void validate() const;
};

// The functions a program can run as replicas of its own jobs (Entrypoint::function). Build one
// at the top of main(), register the functions, and let it take over when the process was
// started as a replica:
//
//   int main(int argc, char** argv) {
//     troupe::Entrypoints entrypoints;
//     entrypoints.add("ps", [](troupe::EventLoop& loop, std::vector<std::string> args) {
//       return troupe::hostActor<ParameterServer>(loop, "ps", kj::heap<ParameterServerImpl>());
//     });
//     KJ_IF_MAYBE(status, entrypoints.runIfReplica()) return *status;
//     ... the program's own work: a launcher submitting Entrypoint::function("ps") ...
//   }
//
// A plain object, not a global registry: the program passes it nowhere else.
//
// How a launcher starts a FUNCTION replica (replicaCommandLine() builds it): the program again,
// as `<program> --troupe-entrypoint <name> -- <args>...`, with TROUPE_ENTRYPOINT=<name> in its
// environment. The arguments travel on the command line, verbatim (so `ps` shows them), and
// runIfReplica() reads them back from /proc/self/cmdline: it needs neither argc nor argv, and
// the program's own flag parsing never sees them. Both marks are required: a process that merely
// inherited TROUPE_ENTRYPOINT (a child the replica started) is not taken for a replica.
//
// When the launcher also sets TROUPE_LAUNCHER_PID (the local launcher does), runIfReplica() asks
// the kernel to SIGKILL the replica when its parent dies (PR_SET_PDEATHSIG), and exits at once
// with status 1 if the parent is already gone: a function replica does not outlive a launcher
// that crashed. Binary entrypoints get no such guarantee (see LocalLauncher).
class Entrypoints {
public:
  // The flag that marks a replica's command line.
  static constexpr kj::StringPtr FLAG = "--troupe-entrypoint"_kj;

  // The arguments (after argv[0]) that start this program as a replica running `entrypoint`
  // (a FUNCTION): {FLAG, function, "--", args...}. The launcher also sets TROUPE_ENTRYPOINT.
  static std::vector<std::string> replicaCommandLine(const Entrypoint& entrypoint);

  // Runs on a fresh EventLoop in the replica process; returns its exit status.
  using Function = std::function<int(EventLoop& loop, std::vector<std::string> args)>;

  // Registers `fn` as `name`. Throws INVALID_ARGUMENT for a name already registered or empty.
  void add(std::string name, Function fn);

  // When this process was started by a launcher as a replica of a FUNCTION entrypoint (the
  // launcher sets TROUPE_ENTRYPOINT), runs the function on a new EventLoop and returns its exit
  // status; otherwise null. A name that was not registered gives status 2, after saying so on
  // stderr; an exception escaping the function gives status 1, after printing it on stderr.
  // The replica's EventLoop logs through spdlog's default logger (its stdout, which the launcher
  // captures). TROUPE_ENTRYPOINT is removed from the environment before the function runs, so
  // processes it starts do not inherit it.
  kj::Maybe<int> runIfReplica() const;

  bool has(const std::string& name) const { return functions.count(name) > 0; }

private:
  std::map<std::string, Function> functions;
};

}  // namespace troupe
