#pragma once
// The "shard" entrypoint of ps_demo: one replica of the shards job, hosting a ParameterServer.

#include <string>
#include <vector>

#include <troupe/base/event_loop.h>

namespace ps {

// Hosts the shard this replica is (TROUPE_TASK_INDEX of TROUPE_NUM_TASKS) of a model whose
// dimension is args[0], as actor "ps", published in the job's resolver; serves until SIGTERM.
// Runs on `loop` (the replica's). Returns the process's exit status (2 for bad arguments).
int runShard(troupe::EventLoop& loop, std::vector<std::string> args);

}  // namespace ps
