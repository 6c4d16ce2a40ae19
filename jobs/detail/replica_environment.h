#pragma once
// The environment a launcher starts a job's replicas with.

#include <cstdint>
#include <string>
#include <vector>

#include <kj/common.h>

#include "troupe/jobs/job_request.h"

namespace troupe::jobs_detail {

struct ReplicaEnvironment {
  std::string resolverUrl;   // TROUPE_RESOLVER
  std::string jobTokenFile;  // TROUPE_JOB_TOKEN_FILE; "": none (the launcher's own is removed)
  uint32_t numTasks = 0;     // TROUPE_NUM_TASKS
  // TROUPE_TASK_INDEX; null leaves it unset (and removes the launcher's own), for a cluster
  // engine that numbers the tasks itself (SLURM_PROCID, which JobContext reads next).
  kj::Maybe<uint32_t> taskIndex;
  std::vector<uint32_t> gpus;  // the GPUs given to the replica (ResourceConfig::deviceEnvironment)
  bool hideGpus = false;       // CUDA_VISIBLE_DEVICES="" when it was given none
  // For a FUNCTION entrypoint: TROUPE_ENTRYPOINT, and TROUPE_LAUNCHER_PID when set.
  kj::Maybe<int> launcherPid;
};

// This process's environment, less what describes its own place in a job (TROUPE_ENTRYPOINT,
// TROUPE_LAUNCHER_PID), then TROUPE_JOB_ID, TROUPE_TASK_INDEX, TROUPE_NUM_TASKS, TROUPE_RESOLVER,
// TROUPE_JOB_TOKEN_FILE, the device's variables, TROUPE_ENTRYPOINT for a function, and last the
// request's own environment, which wins. "NAME=value" each, sorted by name.
std::vector<std::string> replicaEnvironment(const JobRequest& request,
                                            const ReplicaEnvironment& how);

// Where the shell would find program `name`: `name` itself when it holds a '/', else the first
// regular, executable file of that name in $PATH (default /usr/local/bin:/usr/bin:/bin); null
// when there is none.
kj::Maybe<std::string> searchPath(const std::string& name);

// This program's path (/proc/self/exe resolved; "/proc/self/exe" itself when that fails): what
// FUNCTION replicas run by default.
std::string ownProgramPath();

}  // namespace troupe::jobs_detail
