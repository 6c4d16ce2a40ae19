// troupe's parameter-server demo, in one program. Run without an entrypoint it is the driver:
// it starts a job of shards (each a replica of this very program running its "shard" function,
// hosting one ParameterServer actor that owns a slice of a logistic-regression model), then a
// job of trainers (replicas running "trainer") that train the model by asynchronous SGD
// through the shards, and checks that the loss went down.
//
//   ps_demo [--resolver URL] [--launcher local|slurm] [--partition P] [--log-dir DIR]
//           [--shards N] [--trainers M] [--steps K] [--dim D]
//
// With --resolver (e.g. registry://127.0.0.1:7700, a troupe-registry) the jobs publish their
// actors there; without it the local launcher runs a registry of its own. With --launcher slurm
// each job is a Slurm job (SlurmLauncher), which needs --resolver. Exits 0 when the final loss
// is below half of the initial one, 1 otherwise or on failure, 2 for bad arguments.

#include <stdio.h>
#include <stdlib.h>

#include <algorithm>
#include <string>

#include <kj/debug.h>
#include <spdlog/spdlog.h>

#include <troupe/base/errors.h>
#include <troupe/base/parse_number.h>
#include <troupe/jobs/local_launcher.h>
#include <troupe/jobs/slurm_launcher.h>
#include <troupe/pool/actor_pool.h>

#include "model.h"
#include "shard.h"
#include "trainer.h"
#include "weights.h"

namespace {

using ps::ParameterServer;

constexpr kj::Duration READY_TIMEOUT = 60 * kj::SECONDS;
constexpr kj::Duration TRAINING_TIMEOUT = 5 * kj::MINUTES;
constexpr kj::Duration CALL_DEADLINE = 10 * kj::SECONDS;
constexpr size_t LOG_LINES = 20;

struct Options {
  std::string resolver;  // "" = the local launcher's own registry
  bool slurm = false;    // --launcher slurm
  std::string partition;
  std::string logDirectory;  // "" = the launcher's default
  ps::TrainerConfig trainer;
  uint32_t trainers = 2;
  std::string pythonTrainer;  // --python-trainer: trainer.py, run by /usr/bin/python3
};

[[noreturn]] void usage(const char* program, const char* problem) {
  fprintf(stderr,
          "%s: %s\n"
          "usage: %s [--resolver URL] [--launcher local|slurm] [--partition P] [--log-dir DIR]\n"
          "          [--shards N] [--trainers M] [--steps K] [--dim D] [--python-trainer PATH]\n"
          "  --resolver URL  where the jobs publish their actors, e.g. registry://127.0.0.1:7700\n"
          "                  (default: a registry run by the local launcher itself)\n"
          "  --launcher L    local (default: this machine) or slurm (one Slurm job per job;\n"
          "                  needs --resolver, which the nodes must reach)\n"
          "  --partition P   Slurm: the partition (default: the cluster's default)\n"
          "  --log-dir DIR   where the replicas' logs go (on Slurm: a folder every node sees)\n"
          "  --shards N      parameter-server shards, 1..D (default 2)\n"
          "  --trainers M    trainer replicas (default 2)\n"
          "  --steps K       training steps per trainer (default 60)\n"
          "  --dim D         the model's dimension (default 32)\n"
          "  --python-trainer PATH\n"
          "                  run the trainers in Python: PATH is trainer.py (the troupe module\n"
          "                  must be importable: PYTHONPATH)\n",
          program, problem, program);
  exit(2);
}

Options parseOptions(int argc, char** argv) {
  Options options;
  for (int i = 1; i < argc; i += 2) {
    std::string flag = argv[i];
    if (i + 1 >= argc) usage(argv[0], ("missing value after " + flag).c_str());
    std::string value = argv[i + 1];
    if (flag == "--resolver") {
      options.resolver = value;
      continue;
    }
    if (flag == "--launcher") {
      if (value != "local" && value != "slurm") {
        usage(argv[0], ("--launcher is local or slurm, not '" + value + "'").c_str());
      }
      options.slurm = value == "slurm";
      continue;
    }
    if (flag == "--python-trainer") {
      options.pythonTrainer = value;
      continue;
    }
    if (flag == "--partition" || flag == "--log-dir") {
      (flag == "--partition" ? options.partition : options.logDirectory) = value;
      continue;
    }
    auto n = troupe::parseWholeNumber(kj::StringPtr(value.c_str()), 1000000).orDefault(0);
    if (n == 0) {
      usage(argv[0], (flag + " needs a positive number, not '" + value + "'").c_str());
    }
    auto number = static_cast<uint32_t>(n);
    if (flag == "--shards") {
      options.trainer.shards = number;
    } else if (flag == "--trainers") {
      options.trainers = number;
    } else if (flag == "--steps") {
      options.trainer.steps = number;
    } else if (flag == "--dim") {
      options.trainer.dim = number;
    } else {
      usage(argv[0], ("unknown option " + flag).c_str());
    }
  }
  if (options.trainer.shards > options.trainer.dim) {
    usage(argv[0], "--shards must not exceed --dim: every shard owns at least one weight");
  }
  if (options.slurm && options.resolver.empty()) {
    usage(argv[0], "--launcher slurm needs --resolver: the replicas run on the cluster's nodes");
  }
  if (!options.slurm && !options.partition.empty()) {
    usage(argv[0], "--partition is for --launcher slurm");
  }
  return options;
}

void printLogs(const troupe::JobHandle& job) {
  for (auto& line : job.logs(LOG_LINES)) printf("  %s\n", line.c_str());
}

// Locally each replica asks for half a core, or an equal share of the machine when more
// replicas than that run at once, so that both jobs are admitted together (the trainers need
// the shards running). On Slurm, which counts whole cores, one core each. `machineCpus` is 0 on
// Slurm.
troupe::ResourceConfig replicaResources(double machineCpus, const Options& options) {
  if (options.slurm) return troupe::ResourceConfig::withCpu(1, "256m");
  double replicas = options.trainer.shards + options.trainers;
  return troupe::ResourceConfig::withCpu(std::min(0.5, machineCpus / replicas), "256m");
}

// False, having said why, when `job` waits for capacity or can never fit: the demo's jobs must
// run side by side. (On Slurm every job is pending until Slurm starts it; the waits that follow
// fail at once if it never can.)
bool admitted(const troupe::JobHandle& job, const Options& options) {
  if (options.slurm) return true;
  if (job.status() == troupe::JobPhase::PENDING ||
      job.status() == troupe::JobPhase::UNSCHEDULABLE) {
    printf("job '%s' cannot start on this machine: %s\n", job.id().c_str(), job.reason().c_str());
    return false;
  }
  return true;
}

// Everything between starting the launcher and stopping it; returns the exit status.
int train(troupe::EventLoop& loop, troupe::Launcher& launcher, double machineCpus,
          const Options& options) {
  auto& ws = loop.waitScope();
  const auto& config = options.trainer;
  auto data = ps::makeDataset(config.dim);

  printf("== starting job '%s': %u parameter-server shards for a model of dimension %u\n",
         config.shardsJob.c_str(), config.shards, config.dim);
  auto group = troupe::createActorGroup<ParameterServer>(
      launcher,
      {.name = config.shardsJob,
       .entrypoint = troupe::Entrypoint::function("shard", {std::to_string(config.dim)}),
       .resources = replicaResources(machineCpus, options),
       .replicas = config.shards},
      "ps");
  if (!admitted(group.job, options)) return 1;
  group->waitReady(config.shards, READY_TIMEOUT).wait(ws);
  troupe::ActorPool<ParameterServer> pool(*group);
  auto initial = ps::pullWeights(pool, config.dim, CALL_DEADLINE).wait(ws);
  for (auto& shard : initial.shards) {
    printf("shard %s at %s owns weights [%u, %u)\n", shard.name.c_str(), shard.address.c_str(),
           shard.begin, shard.end);
  }
  double initialLoss = ps::logLoss(data, initial.weights);
  printf("initial loss %.4f over %zu examples\n", initialLoss, data.count);
  fflush(stdout);

  printf("== starting job 'trainers': %u trainers, %u steps each (pull from every shard, "
         "compute a gradient, push each shard its slice)\n",
         options.trainers, config.steps);
  fflush(stdout);
  // The C++ trainer (this program's "trainer" function), or the same trainer in Python.
  auto entrypoint = troupe::Entrypoint::function("trainer", config.toArgs());
  if (!options.pythonTrainer.empty()) {
    auto args = config.toArgs();
    args.insert(args.begin(), options.pythonTrainer);
    entrypoint = troupe::Entrypoint::binary("/usr/bin/python3", kj::mv(args));
  }
  auto trainers = launcher.submit({.name = "trainers",
                                   .entrypoint = kj::mv(entrypoint),
                                   .resources = replicaResources(machineCpus, options),
                                   .replicas = options.trainers});
  if (!admitted(trainers, options)) return 1;
  auto phase = trainers.wait(TRAINING_TIMEOUT).wait(ws);
  printf("trainers job %s; what the trainers printed (last %zu lines each):\n",
         troupe::toString(phase).cStr(), LOG_LINES);
  printLogs(trainers);
  if (phase != troupe::JobPhase::SUCCEEDED) {
    printf("the trainers did not succeed: %s\n", trainers.reason().c_str());
    return 1;
  }

  printf("== the shards after training\n");
  auto stats = pool.broadcast([](ParameterServer::Client s) { return s.statsRequest().send(); })
                   .waitAll(CALL_DEADLINE)
                   .wait(ws);
  for (auto& r : stats) {
    KJ_IF_MAYBE(e, r.error) {
      printf("shard %s: stats failed: %s\n", r.endpoint.name.c_str(), e->getDescription().cStr());
      return 1;
    }
    auto& s = KJ_ASSERT_NONNULL(r.value);
    printf("shard %s [%u, %u): %llu pushes applied, version %llu, %llu pulls, "
           "max staleness %llu\n",
           r.endpoint.name.c_str(), s.getBegin(), s.getEnd(),
           static_cast<unsigned long long>(s.getPushes()),
           static_cast<unsigned long long>(s.getVersion()),
           static_cast<unsigned long long>(s.getPulls()),
           static_cast<unsigned long long>(s.getMaxStaleness()));
  }
  auto final = ps::pullWeights(pool, config.dim, CALL_DEADLINE).wait(ws);
  double finalLoss = ps::logLoss(data, final.weights);
  printf("final loss %.4f over %zu examples; cosine(learned, true weights) = %.3f\n", finalLoss,
         data.count, ps::cosine(final.weights, data.trueWeights));
  if (!(finalLoss < initialLoss / 2)) {
    printf("loss did not go down enough: %.4f -> %.4f (wanted below half)\n", initialLoss,
           finalLoss);
    return 1;
  }
  printf("loss went down: %.4f -> %.4f\n", initialLoss, finalLoss);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  troupe::Entrypoints entrypoints;
  entrypoints.add("shard", ps::runShard);
  entrypoints.add("trainer", [](troupe::EventLoop& loop, std::vector<std::string> args) {
    loop.logger()->set_level(spdlog::level::warn);  // keep the trainers' logs to their loss lines
    return ps::runTrainer(loop, kj::mv(args));
  });
  KJ_IF_MAYBE(status, entrypoints.runIfReplica()) {
    return *status;
  }

  auto options = parseOptions(argc, argv);
  spdlog::set_level(spdlog::level::warn);
  troupe::EventLoop loop({.logger = spdlog::default_logger()});
  kj::Own<troupe::LocalLauncher> local;
  kj::Own<troupe::SlurmLauncher> slurm;
  KJ_IF_MAYBE(e, kj::runCatchingExceptions([&]() {
                if (options.slurm) {
                  slurm = kj::heap<troupe::SlurmLauncher>(
                      loop, troupe::SlurmLauncherOptions{.resolver = options.resolver,
                                                         .partition = options.partition,
                                                         .logDirectory = options.logDirectory});
                } else {
                  local = kj::heap<troupe::LocalLauncher>(
                      loop, troupe::LocalLauncherOptions{.resolver = options.resolver,
                                                         .logDirectory = options.logDirectory});
                }
              })) {
    fprintf(stderr, "%s: cannot start the launcher: %s\n", argv[0],
            troupe::errorMessage(*e).cStr());
    return troupe::errorCode(*e) == troupe::ErrorCode::INVALID_ARGUMENT ? 2 : 1;
  }
  troupe::Launcher& launcher = options.slurm ? static_cast<troupe::Launcher&>(*slurm) : *local;
  double machineCpus = options.slurm ? 0 : local->machine().cpus;
  printf("== %s launcher ready: replicas publish in %s, log to %s\n",
         options.slurm ? "Slurm" : "local", launcher.resolverUrl().c_str(),
         (options.slurm ? slurm->logDirectory() : local->logDirectory()).c_str());
  fflush(stdout);

  int status = 1;
  KJ_IF_MAYBE(e, kj::runCatchingExceptions(
                     [&]() { status = train(loop, launcher, machineCpus, options); })) {
    printf("demo failed: %s\n", e->getDescription().cStr());
    KJ_IF_MAYBE(shards, launcher.find(options.trainer.shardsJob)) {
      printf("what the shards printed (last %zu lines each):\n", LOG_LINES);
      printLogs(*shards);
    }
    status = 1;
  }

  printf("== stopping: SIGTERM drains the shards, then the launcher shuts down\n");
  KJ_IF_MAYBE(shards, launcher.find(options.trainer.shardsJob)) {
    shards->terminate().wait(loop.waitScope());
    printf("shards job %s\n", troupe::toString(shards->status()).cStr());
  }
  (options.slurm ? slurm->drain() : local->drain()).wait(loop.waitScope());
  fflush(stdout);
  return status;
}
