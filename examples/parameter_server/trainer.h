#pragma once
// The "trainer" entrypoint of ps_demo: one replica of the trainers job.

#include <cstdint>
#include <string>
#include <vector>

#include <troupe/base/event_loop.h>

namespace ps {

// What a trainer does, as the driver passes it on the replica's command line.
struct TrainerConfig {
  std::string shardsJob = "shards";  // the job whose replicas host the shards (actor "ps")
  uint32_t shards = 2;               // how many shards to wait for
  uint32_t dim = 32;                 // the model's dimension
  uint32_t steps = 60;               // pull / compute / push rounds
  uint32_t batch = 64;               // examples per minibatch
  float learningRate = 1.0f;         // applied by the shards to each gradient
  uint32_t printEvery = 10;          // print the loss every this many steps (and at the last)

  // As arguments for Entrypoint::function, and back; parse() returns false for bad ones.
  std::vector<std::string> toArgs() const;
  bool parse(const std::vector<std::string>& args);
};

// Finds the shards through the job's resolver (TROUPE_RESOLVER), waits until all are ready, then
// trains: each step pulls the weights from every shard (a broadcast), computes the gradient of
// the log-loss on this trainer's next minibatch (its own share of the data set: examples
// TROUPE_TASK_INDEX, + TROUPE_NUM_TASKS, ...) and pushes each shard its slice of it. Prints
// "trainer I step S loss L" every printEvery steps. Runs on `loop`; returns the exit status
// (2 for bad arguments, 1 when a shard could not be reached).
int runTrainer(troupe::EventLoop& loop, std::vector<std::string> args);

}  // namespace ps
