#include "trainer.h"

#include <stdio.h>
#include <stdlib.h>

#include <kj/debug.h>
#include <kj/vector.h>

#include <troupe/actor/job_context.h>
#include <troupe/base/parse_number.h>
#include <troupe/pool/actor_pool.h>
#include <troupe/resolver/open_resolver.h>

#include "model.h"
#include "weights.h"

namespace ps {

namespace {

constexpr kj::Duration CALL_DEADLINE = 10 * kj::SECONDS;
constexpr kj::Duration READY_TIMEOUT = 60 * kj::SECONDS;

bool parseNumber(const std::string& text, uint32_t& out) {
  auto value = troupe::parseWholeNumber(kj::StringPtr(text.c_str()), UINT32_MAX).orDefault(0);
  if (value == 0) return false;
  out = static_cast<uint32_t>(value);
  return true;
}

// Pushes each shard of `snapshot` its slice of `gradient`, all at once, straight to the member
// that owns the slice. Resolves when every shard has applied its slice.
kj::Promise<void> pushGradient(troupe::ActorGroup<ParameterServer>& group, const Snapshot& snapshot,
                               const std::vector<float>& gradient, float learningRate) {
  kj::Vector<kj::Promise<void>> pushes;
  // Members are looked up afresh each step: the snapshot may name one that has restarted since.
  auto members = group.readyMembers();
  for (auto& slice : snapshot.shards) {
    kj::Maybe<const troupe::GroupMember&> owner;
    for (auto& m : members) {
      if (m->endpoint.name == slice.name) owner = *m;
    }
    KJ_IF_MAYBE(member, owner) {
      troupe::ActorRef<ParameterServer> ref(member->ref);
      pushes.add(ref.call(
                        [&](ParameterServer::Client shard) {
                          auto request = shard.pushRequest();
                          auto out = request.initGradient(slice.end - slice.begin);
                          for (uint32_t i = slice.begin; i < slice.end; ++i) {
                            out.set(i - slice.begin, gradient[i]);
                          }
                          request.setLearningRate(learningRate);
                          request.setBaseVersion(slice.version);
                          return request.send();
                        },
                        {.deadline = CALL_DEADLINE})
                     .ignoreResult());
    } else {
      KJ_FAIL_REQUIRE("shard left the group", slice.name);
    }
  }
  return kj::joinPromises(pushes.releaseAsArray());
}

}  // namespace

std::vector<std::string> TrainerConfig::toArgs() const {
  return {shardsJob,
          std::to_string(shards),
          std::to_string(dim),
          std::to_string(steps),
          std::to_string(batch),
          std::to_string(learningRate),
          std::to_string(printEvery)};
}

bool TrainerConfig::parse(const std::vector<std::string>& args) {
  if (args.size() != 7) return false;
  shardsJob = args[0];
  char* end = nullptr;
  learningRate = strtof(args[5].c_str(), &end);
  return parseNumber(args[1], shards) && parseNumber(args[2], dim) && parseNumber(args[3], steps) &&
         parseNumber(args[4], batch) && *end == '\0' && learningRate > 0 &&
         parseNumber(args[6], printEvery);
}

int runTrainer(troupe::EventLoop& loop, std::vector<std::string> args) {
  TrainerConfig config;
  if (!config.parse(args)) {
    fprintf(stderr, "usage: trainer SHARDS_JOB SHARDS DIM STEPS BATCH LEARNING_RATE PRINT_EVERY\n");
    return 2;
  }
  auto& ws = loop.waitScope();
  auto job = troupe::JobContext::fromEnvironment();
  if (job.resolver.empty()) {
    fprintf(stderr, "trainer: TROUPE_RESOLVER is not set\n");
    return 2;
  }
  auto resolver = troupe::openResolver(loop, job.resolver);
  troupe::ActorGroup<ParameterServer> group(loop, *resolver, config.shardsJob, "ps");
  auto ready = group.waitReady(config.shards, READY_TIMEOUT).wait(ws);
  printf("trainer %u of %u: %zu shards ready\n", job.taskIndex, job.numTasks, ready.size());
  fflush(stdout);
  troupe::ActorPool<ParameterServer> pool(group);

  // This trainer's share of the data: every numTasks-th example, from its own index.
  auto data = makeDataset(config.dim);
  std::vector<size_t> mine;
  for (size_t i = job.taskIndex; i < data.count; i += job.numTasks) mine.push_back(i);
  KJ_REQUIRE(!mine.empty(), "more trainers than examples");

  std::vector<size_t> batch;
  std::vector<float> gradient;
  size_t next = 0;
  for (uint32_t step = 1; step <= config.steps; ++step) {
    auto snapshot = pullWeights(pool, config.dim, CALL_DEADLINE).wait(ws);
    batch.clear();
    for (uint32_t k = 0; k < config.batch; ++k) {
      batch.push_back(mine[next]);
      next = (next + 1) % mine.size();
    }
    double loss = ps::gradient(data, snapshot.weights, batch, gradient);
    pushGradient(group, snapshot, gradient, config.learningRate).wait(ws);
    if (step % config.printEvery == 0 || step == 1 || step == config.steps) {
      printf("trainer %u step %u loss %.4f\n", job.taskIndex, step, loss);
      fflush(stdout);
    }
  }
  return 0;
}

}  // namespace ps
