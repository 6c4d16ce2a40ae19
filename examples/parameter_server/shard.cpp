#include "shard.h"

#include <stdio.h>
#include <stdlib.h>

#include <algorithm>

#include <kj/debug.h>

#include <troupe/base/parse_number.h>
#include <troupe/resolver/host_actor.h>

#include "model.h"
#include "parameter_server.capnp.h"

namespace ps {

namespace {

// One shard: the weights [begin, end) of the model, all zero at first.
//
// Calls may interleave (maxConcurrency 0), so a pull is answered at once even while an update
// is being applied on a worker thread. Updates themselves apply one at a time, in arrival
// order: each waits for the one before, lets a worker compute the new slice from a copy, and
// swaps it in on the loop thread. The worker never touches `weights`, so a pull sees the slice
// before or after an update, never half-way through one.
class ShardImpl final : public ParameterServer::Server {
public:
  ShardImpl(troupe::EventLoop& loop, uint32_t dim, uint32_t begin, uint32_t end)
      : loop(loop),
        dim(dim),
        begin(begin),
        end(end),
        weights(end - begin, 0.0f),
        lastUpdate(kj::Promise<void>(kj::READY_NOW).fork()) {}

protected:
  kj::Promise<void> pull(PullContext context) override {
    ++pulls;
    auto results = context.getResults();
    auto out = results.initWeights(static_cast<unsigned>(weights.size()));
    for (size_t i = 0; i < weights.size(); ++i) out.set(static_cast<unsigned>(i), weights[i]);
    results.setVersion(version);
    results.setBegin(begin);
    results.setEnd(end);
    results.setDim(dim);
    return kj::READY_NOW;
  }

  kj::Promise<void> push(PushContext context) override {
    auto params = context.getParams();
    auto in = params.getGradient();
    KJ_REQUIRE(in.size() == weights.size(), "gradient of the wrong size for this shard", in.size(),
               weights.size());
    ++pushes;
    std::vector<float> gradient;
    gradient.reserve(in.size());
    for (float g : in) gradient.push_back(g);
    float learningRate = params.getLearningRate();
    uint64_t baseVersion = params.getBaseVersion();

    auto applied = lastUpdate.addBranch()
                       .then([this, gradient = std::move(gradient), learningRate]() mutable {
                         return loop.offload([next = weights, gradient = std::move(gradient),
                                              learningRate]() mutable {
                           for (size_t i = 0; i < next.size(); ++i)
                             next[i] -= learningRate * gradient[i];
                           return next;
                         });
                       })
                       .then([this, baseVersion](std::vector<float>&& next) {
                         weights = std::move(next);
                         maxStaleness = std::max(maxStaleness,
                                                 version - std::min(version, baseVersion));
                         return ++version;
                       })
                       .fork();
    // The next update waits for this one, whether it succeeded or not. The chain lives in the
    // actor, so an update whose caller gave up (deadline, cancellation) still applies.
    lastUpdate = applied.addBranch().ignoreResult().catch_([](kj::Exception&&) {}).fork();
    return applied.addBranch().then(
        [context](uint64_t v) mutable { context.getResults().setVersion(v); });
  }

  kj::Promise<void> stats(StatsContext context) override {
    auto results = context.getResults();
    results.setBegin(begin);
    results.setEnd(end);
    results.setVersion(version);
    results.setPushes(pushes);
    results.setPulls(pulls);
    results.setMaxStaleness(maxStaleness);
    return kj::READY_NOW;
  }

private:
  troupe::EventLoop& loop;
  const uint32_t dim;
  const uint32_t begin;
  const uint32_t end;
  std::vector<float> weights;  // [begin, end); replaced whole by each update
  uint64_t version = 0;        // updates applied
  uint64_t pushes = 0;         // updates received
  uint64_t pulls = 0;
  uint64_t maxStaleness = 0;  // most updates applied between a gradient's pull and its push
  kj::ForkedPromise<void> lastUpdate;
};

}  // namespace

int runShard(troupe::EventLoop& loop, std::vector<std::string> args) {
  uint32_t dim = 0;
  if (args.size() == 1) {
    dim = static_cast<uint32_t>(
        troupe::parseWholeNumber(kj::StringPtr(args[0].c_str()), UINT32_MAX).orDefault(0));
  }
  if (dim == 0) {
    fprintf(stderr, "usage: shard DIM\n");
    return 2;
  }
  auto job = troupe::JobContext::fromEnvironment();
  uint32_t begin = shardBegin(dim, job.taskIndex, job.numTasks);
  uint32_t end = shardBegin(dim, job.taskIndex + 1, job.numTasks);
  if (begin == end) {
    fprintf(stderr, "shard %u of %u would own no weights of %u\n", job.taskIndex, job.numTasks,
            dim);
    return 2;
  }
  printf("shard %u of %u owns weights [%u, %u) of %u\n", job.taskIndex, job.numTasks, begin, end,
         dim);
  fflush(stdout);
  return troupe::hostActor<ParameterServer>(loop, "ps", kj::heap<ShardImpl>(loop, dim, begin, end),
                                            {.actor = {.maxConcurrency = 0}});
}

}  // namespace ps
