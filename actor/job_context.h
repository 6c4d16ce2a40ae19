#pragma once
// JobContext: which job and replica this process is, read from the environment.

#include <cstdint>
#include <string>

#include <kj/function.h>
#include <kj/string.h>

namespace troupe {

// A plain value describing this replica of a job.
struct JobContext {
  std::string jobId = "local";  // the job's id; "local" when nothing says otherwise
  uint32_t taskIndex = 0;       // this replica's index, 0 <= taskIndex < numTasks
  uint32_t numTasks = 1;        // how many replicas the job has
  std::string resolver;         // resolver URL (e.g. "registry://host:7700"); "" = none
  std::string advertiseHost;    // host others reach this replica at; "" = derive from listen()
  std::string metricsAddress;   // where the server serves HTTP (/metrics ...); "" = nowhere

  // Reads the environment, troupe's variables first, then what cluster engines set:
  //
  //   jobId          TROUPE_JOB_ID, else SLURM_JOB_ID, else "local"
  //   taskIndex      TROUPE_TASK_INDEX, else SLURM_PROCID, else JOB_COMPLETION_INDEX
  //                  (Kubernetes indexed jobs), else 0
  //   numTasks       TROUPE_NUM_TASKS, else SLURM_NTASKS, else 1
  //   resolver       TROUPE_RESOLVER
  //   advertiseHost  TROUPE_ADVERTISE_HOST
  //   metricsAddress TROUPE_METRICS ("HOST:PORT", port 0 for any; see ActorServerOptions)
  //
  // Throws INVALID_ARGUMENT naming the variable when a value is malformed (a job id that breaks
  // the naming rules, an index that is not a number, an index not below numTasks).
  static JobContext fromEnvironment();

  // The same, reading variables through `getenv` (returns null for unset ones). For tests and
  // for launchers that build a replica's environment.
  using EnvLookup = kj::Function<kj::Maybe<kj::StringPtr>(kj::StringPtr name)>;
  static JobContext fromEnvironment(EnvLookup getenv);

  // "<jobId>/<actor>-<taskIndex>"; throws INVALID_ARGUMENT for a bad actor name.
  std::string endpointName(kj::StringPtr actor) const;
};

}  // namespace troupe
