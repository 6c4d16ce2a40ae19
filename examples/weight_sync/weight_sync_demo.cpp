// A trainer publishing new weights to an inference pool every step, while the pool serves.
//
//   weight_sync_demo --resolver URL [--replicas N] [--steps S] [--mib M] [--fanout F]
//
// The driver (the trainer) submits a job "infer" of N replicas (default 4) to a LocalLauncher
// publishing in the resolver at URL. Each replica is this program again, on its "replica"
// entrypoint: it hosts the actor "model" (weight_sync.capnp) and accepts blobs named "weights"
// into fresh memory; when a version has arrived whole and checked, it swaps it in with one
// assignment on its loop, so every request is answered by one version or the next, never by a
// mix. Then for each of S steps (default 5) the trainer makes version `step` of the weights
// (M MiB, default 64, every float equal to the version) and broadcasts it to the pool
// (ActorPool::broadcastBlob, fanout F: chain by default, or star or tree), while 8 requests at a
// time keep going to the pool. Every answer must equal version * sum(input) for the version it
// names. It prints each version's broadcast time and the requests served meanwhile, checks that
// every replica holds the last version, and exits non-zero if anything failed.

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

#include <chrono>
#include <cmath>
#include <set>
#include <string>
#include <vector>

#include <kj/debug.h>
#include <spdlog/spdlog.h>

#include <troupe/actor/actor_server.h>
#include <troupe/actor/job_context.h>
#include <troupe/base/errors.h>
#include <troupe/base/parse_number.h>
#include <troupe/jobs/launcher.h>
#include <troupe/jobs/local_launcher.h>
#include <troupe/pool/actor_pool.h>
#include <troupe/resolver/host_actor.h>

#include "weight_sync.capnp.h"

using weightsync::Model;
using Clock = std::chrono::steady_clock;

namespace {

constexpr kj::StringPtr JOB = "infer"_kj;
constexpr kj::StringPtr ACTOR = "model"_kj;
constexpr size_t INPUTS = 256;
constexpr uint32_t IN_FLIGHT = 8;

// ---------------------------------------------------------------------------------------------
// A replica.

struct Weights {
  uint64_t version = 0;
  kj::Array<const kj::byte> bytes;  // floats
};

class ModelImpl final : public Model::Server {
public:
  // The version being served, swapped whole.
  kj::Own<const Weights> serving = kj::heap<Weights>();
  uint64_t swaps = 0;

protected:
  kj::Promise<void> infer(InferContext context) override {
    auto input = context.getParams().getInput();
    auto& w = *serving;
    auto* weights = reinterpret_cast<const float*>(w.bytes.begin());
    size_t n = std::min<size_t>(input.size(), w.bytes.size() / sizeof(float));
    double sum = 0;
    for (size_t i = 0; i < n; ++i) sum += double(input[i]) * weights[i];
    auto results = context.getResults();
    results.setOutput(static_cast<float>(sum));
    results.setVersion(w.version);
    return kj::READY_NOW;
  }

  kj::Promise<void> current(CurrentContext context) override {
    auto results = context.getResults();
    results.setVersion(serving->version);
    results.setBytes(serving->bytes.size());
    results.setSwaps(swaps);
    return kj::READY_NOW;
  }
};

int runReplica(troupe::EventLoop& loop) {
  troupe::ActorServer server(loop, troupe::JobContext::fromEnvironment());
  auto model = kj::heap<ModelImpl>();
  auto& state = *model;
  server.host<Model>(ACTOR, kj::mv(model));
  server.acceptBlobs(
      "weights", [](const troupe::BlobHeader& h) { return troupe::allocateBlobMemory(h.size); },
      [&state](troupe::Blob blob) {
        // One assignment on the loop: a request sees the old version or the new one.
        state.serving = kj::heap<Weights>(Weights{blob.version, kj::mv(blob.bytes)});
        ++state.swaps;
      });
  troupe::serveReplica(loop, server);
  return 0;
}

// ---------------------------------------------------------------------------------------------
// The trainer.

struct Options {
  const char* program = "weight_sync_demo";
  std::string resolver;
  uint32_t replicas = 4;
  uint32_t steps = 5;
  uint64_t mib = 64;
  troupe::Fanout fanout = troupe::Fanout::CHAIN;
};

[[noreturn]] void usage(const char* program, const char* problem) {
  fprintf(stderr, "%s: %s\n", program, problem);
  fprintf(stderr,
          "usage: %s --resolver URL [--replicas N] [--steps S] [--mib M] "
          "[--fanout chain|star|tree]\n"
          "  N replicas (default 4), S versions (default 5), M MiB of weights (default 64)\n",
          program);
  exit(2);
}

uint64_t parseCount(const char* program, const char* flag, const char* text, uint64_t min,
                    uint64_t max) {
  auto parsed = troupe::parseWholeNumber(kj::StringPtr(text), max);
  uint64_t value = parsed.orDefault(0);
  if (parsed == nullptr || value < min) {
    usage(program, kj::str(flag, " takes a whole number from ", min, " to ", max, ", not '",
                           troupe::printable(kj::StringPtr(text)), "'")
                       .cStr());
  }
  return value;
}

Options parseArgs(int argc, char** argv) {
  Options o;
  o.program = argv[0];
  for (int i = 1; i < argc; i += 2) {
    kj::StringPtr flag = argv[i];
    if (i + 1 >= argc) usage(argv[0], kj::str(flag, " needs a value").cStr());
    const char* value = argv[i + 1];
    if (flag == "--resolver") {
      o.resolver = value;
    } else if (flag == "--replicas") {
      o.replicas = parseCount(argv[0], argv[i], value, 1, 64);
    } else if (flag == "--steps") {
      o.steps = parseCount(argv[0], argv[i], value, 1, 1000);
    } else if (flag == "--mib") {
      o.mib = parseCount(argv[0], argv[i], value, 1, 16384);
    } else if (flag == "--fanout") {
      kj::StringPtr f = value;
      if (f == "chain") {
        o.fanout = troupe::Fanout::CHAIN;
      } else if (f == "star") {
        o.fanout = troupe::Fanout::STAR;
      } else if (f == "tree") {
        o.fanout = troupe::Fanout::TREE;
      } else {
        usage(argv[0], "--fanout is chain, star or tree");
      }
    } else {
      usage(argv[0], kj::str("unknown argument '", troupe::printable(flag), "'").cStr());
    }
  }
  if (o.resolver.empty()) usage(argv[0], "--resolver is required");
  return o;
}

// Requests through the pool, IN_FLIGHT at a time, until stop(): every answer checked against the
// version it names. Loop thread only.
class Load {
public:
  explicit Load(troupe::ActorPool<Model>& pool) : pool(pool) {
    for (size_t i = 0; i < INPUTS; ++i) input.push_back(float(i % 7) - 3.0f + 0.5f);
    for (float v : input) inputSum += v;
  }

  kj::Promise<void> run() {
    stopping = false;
    auto workers = kj::heapArrayBuilder<kj::Promise<void>>(IN_FLIGHT);
    for (uint32_t i = 0; i < IN_FLIGHT; ++i) workers.add(worker());
    return kj::joinPromises(workers.finish());
  }
  void stop() { stopping = true; }

  uint64_t served = 0, wrong = 0, failed = 0;
  std::set<uint64_t> versions;  // seen since the last reset

private:
  kj::Promise<void> worker() {
    if (stopping) return kj::READY_NOW;
    auto call = pool.call(
        [this](Model::Client m) {
          auto request = m.inferRequest();
          auto list = request.initInput(input.size());
          for (size_t i = 0; i < input.size(); ++i) list.set(i, input[i]);
          return request.send();
        },
        {.deadline = 10 * kj::SECONDS, .idempotent = true});
    return call
        .then(
            [this](capnp::Response<Model::InferResults>&& r) {
              ++served;
              versions.insert(r.getVersion());
              double expected = double(r.getVersion()) * inputSum;
              if (std::abs(double(r.getOutput()) - expected) > 1e-3 * (1 + std::abs(expected))) {
                ++wrong;
              }
            },
            [this](kj::Exception&& e) {
              if (++failed <= 3) fprintf(stderr, "request failed: %s\n", e.getDescription().cStr());
            })
        .then([this]() { return worker(); });
  }

  troupe::ActorPool<Model>& pool;
  std::vector<float> input;
  double inputSum = 0;
  bool stopping = false;
};

kj::Array<const kj::byte> weightsOf(uint64_t version, uint64_t bytes) {
  auto out = kj::heapArray<kj::byte>(bytes);
  auto* floats = reinterpret_cast<float*>(out.begin());
  for (uint64_t i = 0; i < bytes / sizeof(float); ++i) floats[i] = float(version);
  return out;
}

const char* fanoutName(troupe::Fanout f) {
  return f == troupe::Fanout::CHAIN ? "chain" : f == troupe::Fanout::STAR ? "star" : "tree";
}

// Publishes the versions; returns whether everything was as it should be.
bool train(troupe::EventLoop& loop, const Options& o, troupe::ActorGroup<Model>& group) {
  auto& ws = loop.waitScope();
  troupe::ActorPool<Model> pool(group);
  Load load(pool);
  bool ok = true;
  uint64_t bytes = o.mib << 20;
  for (uint32_t step = 1; step <= o.steps; ++step) {
    auto weights = weightsOf(step, bytes);  // the trainer's step
    load.versions.clear();
    uint64_t servedBefore = load.served;
    auto running = load.run().eagerlyEvaluate(nullptr);
    auto start = Clock::now();
    auto sent = pool.broadcastBlob("weights", step, kj::mv(weights), {.fanout = o.fanout});
    auto results = sent.waitAll(120 * kj::SECONDS).wait(ws);
    double ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
    load.stop();
    running.wait(ws);
    size_t got = 0;
    for (auto& r : results) {
      KJ_IF_MAYBE(e, r.error) {
        printf("  %s did not get version %u: %s\n", r.endpoint.c_str(), step,
               e->getDescription().cStr());
      } else {
        ++got;
      }
    }
    std::string seen;
    for (auto v : load.versions) seen += (seen.empty() ? "" : ",") + std::to_string(v);
    printf("version %u: %llu MiB to %zu of %zu replicas in %.0f ms (%s, %.0f MB/s), "
           "%llu requests served meanwhile (versions answering: %s)\n",
           step, (unsigned long long)o.mib, got, results.size(), ms, fanoutName(o.fanout),
           bytes / ms / 1e3, (unsigned long long)(load.served - servedBefore), seen.c_str());
    fflush(stdout);
    ok = ok && got == results.size() && results.size() == o.replicas;
  }
  printf("requests: %llu served, %llu wrong, %llu failed\n", (unsigned long long)load.served,
         (unsigned long long)load.wrong, (unsigned long long)load.failed);
  ok = ok && load.wrong == 0 && load.failed == 0;

  auto held = pool.broadcast([](Model::Client m) { return m.currentRequest().send(); })
                  .waitAll(10 * kj::SECONDS)
                  .wait(ws);
  for (auto& r : held) {
    KJ_IF_MAYBE(v, r.value) {
      printf("%s holds version %llu (%llu MiB), %llu versions swapped in\n",
             r.endpoint.name.c_str(), (unsigned long long)v->getVersion(),
             (unsigned long long)(v->getBytes() >> 20), (unsigned long long)v->getSwaps());
      ok = ok && v->getVersion() == o.steps && v->getBytes() == bytes;
    } else {
      printf("%s did not answer: %s\n", r.endpoint.name.c_str(),
             KJ_ASSERT_NONNULL(r.error).getDescription().cStr());
      ok = false;
    }
  }
  return ok;
}

int runTrainer(const Options& o) {
  troupe::EventLoop loop({.logger = spdlog::default_logger()});
  auto& ws = loop.waitScope();
  kj::Own<troupe::LocalLauncher> launcherOwn;
  KJ_IF_MAYBE(e, kj::runCatchingExceptions([&]() {
                launcherOwn = kj::heap<troupe::LocalLauncher>(loop, troupe::LocalLauncherOptions{
                                                                        .resolver = o.resolver});
              })) {
    if (troupe::errorCode(*e) != troupe::ErrorCode::INVALID_ARGUMENT) {
      kj::throwFatalException(kj::mv(*e));
    }
    usage(o.program, kj::str(troupe::errorMessage(*e)).cStr());
  }
  auto& launcher = *launcherOwn;
  auto group =
      troupe::createActorGroup<Model>(launcher,
                                      {.name = std::string(JOB.cStr()),
                                       .entrypoint = troupe::Entrypoint::function("replica"),
                                       .replicas = o.replicas},
                                      ACTOR);
  auto& job = group.job;
  bool passed = false;
  KJ_IF_MAYBE(e, kj::runCatchingExceptions([&]() {
                auto ready = group->waitReady(o.replicas, 30 * kj::SECONDS).wait(ws);
                printf("%zu replicas ready; publishing %u versions of %llu MiB, %s\n", ready.size(),
                       o.steps, (unsigned long long)o.mib, fanoutName(o.fanout));
                fflush(stdout);
                passed = train(loop, o, *group);
              })) {
    fprintf(stderr, "weight sync demo failed: %s\n", e->getDescription().cStr());
    for (auto& line : job.logs(5)) fprintf(stderr, "%s\n", line.c_str());
  }
  job.terminate().wait(ws);
  launcher.drain().wait(ws);
  printf(passed ? "weight sync demo passed\n" : "weight sync demo FAILED\n");
  return passed ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  troupe::Entrypoints entrypoints;
  entrypoints.add("replica", [](troupe::EventLoop& loop, std::vector<std::string>) {
    return runReplica(loop);
  });
  KJ_IF_MAYBE(status, entrypoints.runIfReplica()) {
    return *status;
  }
  return runTrainer(parseArgs(argc, argv));
}
