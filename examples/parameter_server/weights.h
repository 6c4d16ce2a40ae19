#pragma once
// Reading the whole model from its shards: one pull broadcast, the slices put together.

#include <string>
#include <vector>

#include <kj/async.h>

#include <troupe/pool/actor_pool.h>

#include "parameter_server.capnp.h"

namespace ps {

// One shard's part of a Snapshot.
struct ShardSlice {
  std::string name;     // the shard's endpoint name, "<job>/ps-<index>"
  std::string address;  // where it serves
  uint32_t begin = 0;   // the weights it owns: [begin, end)
  uint32_t end = 0;
  uint64_t version = 0;  // its version when it answered
};

// The model's weights as the shards held them during one pull broadcast.
struct Snapshot {
  std::vector<float> weights;      // dim
  std::vector<ShardSlice> shards;  // in name order
};

// Broadcasts pull to every READY member of `pool`'s group and assembles the result. Rejects
// when a shard fails or does not answer within `deadline`, or when the slices do not cover
// [0, dim) exactly once (fewer than all shards ready, shards of another dimension). The pool
// must outlive the promise.
kj::Promise<Snapshot> pullWeights(troupe::ActorPool<ParameterServer>& pool, uint32_t dim,
                                  kj::Duration deadline);

}  // namespace ps
