#pragma once
// Slurm's commands (sbatch, squeue, scontrol, scancel), run with libuv's process API and never
// through a shell, and what their output says about a job.

#include <cstdint>
#include <string>
#include <vector>

#include <kj/async.h>
#include <kj/time.h>

#include "troupe/base/event_loop.h"
#include "troupe/jobs/detail/subprocess.h"

namespace troupe::jobs_detail {

// The path of `name` in $PATH (or `name` itself when it holds a '/'). Throws FAILED naming the
// command and the folders searched when it is nowhere.
std::string findCommand(const std::string& name);

// What a command printed (stdout and stderr together, at most MAX_COMMAND_OUTPUT bytes) and how
// it ended.
struct CommandOutput {
  ExitStatus status;
  std::string text;
};
constexpr size_t MAX_COMMAND_OUTPUT = 16u << 20;

// Runs `argv` (argv[0] found by findCommand) with the complete environment `env`. Resolves
// once it exited; rejects with FAILED when it cannot be started (naming it) and with
// DEADLINE_EXCEEDED once `timeout` passed (it is killed then).
kj::Promise<CommandOutput> runCommand(EventLoop& loop, std::vector<std::string> argv,
                                      std::vector<std::string> env, kj::Duration timeout);

// The same, to completion before it returns, on a libuv loop of its own: for a constructor,
// which cannot wait on its loop. Throws what the promise would reject with.
CommandOutput runCommandNow(const std::vector<std::string>& argv,
                            const std::vector<std::string>& env, kj::Duration timeout);

// "sbatch exited with status 1: sbatch: error: ...; sbatch: error: ...": what the command said,
// on one line.
std::string describeFailure(const std::vector<std::string>& argv, const CommandOutput& output);

// One Slurm job, as squeue or scontrol report it.
struct SlurmJobInfo {
  uint64_t id = 0;
  std::string name;
  std::string comment;
  std::string state;   // Slurm's: "PENDING", "RUNNING", "COMPLETED", "FAILED", "CANCELLED", ...
  std::string reason;  // why it is pending, or how it ended: "Resources", "None", ...
  int exitCode = 0;    // of the batch script, once it ended
  int exitSignal = 0;
  uint32_t restarts = 0;  // times it was requeued
  uint32_t tasks = 0;
};

// The jobs in `squeue --json` output. Throws FAILED when it is not that. `tasks` is each job's
// task count.
std::vector<SlurmJobInfo> parseSqueueJson(kj::ArrayPtr<const char> json);

// The job in one line of `scontrol -o show job ID` ("JobId=7 JobName=calc ... JobState=FAILED
// Reason=NonZeroExitCode ... ExitCode=3:0 ..."); null when the line holds no JobId, or a JobId,
// Restarts or ExitCode that is not a number.
kj::Maybe<SlurmJobInfo> parseScontrolJob(kj::StringPtr line);

// Whether Slurm's state is one a job does not leave (COMPLETED, FAILED, CANCELLED, TIMEOUT,
// NODE_FAIL, OUT_OF_MEMORY, BOOT_FAIL, DEADLINE, PREEMPTED).
bool slurmStateIsFinal(kj::StringPtr state);

// Whether a pending job's reason says it can never run as asked (a partition, node, time or
// association limit it exceeds, or a request no node satisfies), so that waiting is pointless.
bool pendingReasonIsFinal(kj::StringPtr reason);

}  // namespace troupe::jobs_detail
