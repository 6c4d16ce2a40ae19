// troupe launch [options] -- BINARY ARGS...: runs a job in the foreground, on this machine or on
// a Slurm cluster.

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <string>
#include <utility>
#include <vector>

#include <kj/debug.h>

#include "troupe/base/errors.h"
#include "troupe/base/event_loop.h"
#include "troupe/base/parse_number.h"
#include "troupe/jobs/local_launcher.h"
#include "troupe/jobs/slurm_launcher.h"
#include "tools/troupe/cli.h"
#include "tools/troupe/commands.h"

namespace troupe::cli {

namespace {

// How long a launch waits for a resolver it cannot reach before its job fails.
constexpr kj::Duration RESOLVER_PATIENCE = 5 * kj::SECONDS;

// BINARY as the shell would find it: a name without '/' is looked up in $PATH.
std::string findProgram(const std::string& name) {
  KJ_IF_MAYBE(found, troupe::findProgram(name)) {
    return *found;
  }
  return name;
}

// A job name from a program's file name: what the name rules allow, the rest as '-'.
std::string nameFrom(const std::string& program) {
  auto slash = program.rfind('/');
  std::string base = slash == std::string::npos ? program : program.substr(slash + 1);
  std::string out;
  for (char c : base)
    out += (isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-') ? c : '-';
  while (!out.empty() && !isalnum(static_cast<unsigned char>(out[0]))) out.erase(0, 1);
  return out.empty() ? "job" : out.substr(0, 64);
}

// "H100:8" as a GPU type and a count of 1..64.
std::pair<std::string, uint32_t> parseGpu(kj::StringPtr text) {
  auto error = [&]() {
    return UsageError{
        kj::str("--gpu needs TYPE:COUNT with COUNT 1..64, not '", printable(text), "'").cStr()};
  };
  KJ_IF_MAYBE(colon, text.findLast(':')) {
    if (*colon == 0) throw error();
    uint64_t count = parseWholeNumber(text.slice(*colon + 1), 64).orDefault(0);
    if (count == 0) throw error();
    return {std::string(text.begin(), *colon), static_cast<uint32_t>(count)};
  }
  throw error();
}

// Prints what changed in the job since `shown`.
class Reporter {
public:
  explicit Reporter(JobHandle job) : job(kj::mv(job)) {}

  void report() {
    auto phase = job.status();
    auto reason = job.reason();
    if (phase != lastPhase || reason != lastReason) {
      // Not "running" before the resolver has the job: its replicas wait for it.
      bool waiting = phase == JobPhase::RUNNING &&
                     kj::StringPtr(reason.c_str()).startsWith(WAITING_FOR_RESOLVER);
      printf("job %s: %s%s%s\n", job.id().c_str(), waiting ? "" : toString(phase).cStr(),
             reason.empty() || waiting ? "" : ": ", reason.c_str());
      lastPhase = phase;
      lastReason = reason;
    }
    auto replicas = job.replicas();
    shown.resize(replicas.size());
    for (auto& r : replicas) {
      auto& before = shown[r.index];
      if (r.pid != 0 && (r.pid != before.pid || r.starts != before.starts)) {
        printf("  replica %u: running, pid %d%s\n", r.index, r.pid,
               r.starts > 1 ? (" (start " + std::to_string(r.starts) + ")").c_str() : "");
      } else if (r.pid == 0 && before.pid != 0) {
        printf("  replica %u: exited (pid %d)\n", r.index, before.pid);
      }
      before = r;
    }
    fflush(stdout);
  }

  kj::Promise<void> follow() {
    report();
    if (isFinal(job.status())) return kj::READY_NOW;
    return job.whenChanged().then([this]() { return follow(); });
  }

private:
  JobHandle job;
  kj::Maybe<JobPhase> lastPhase;
  std::string lastReason;
  std::vector<ReplicaInfo> shown;
};

class LaunchCommand final : public Command {
public:
  kj::MainFunc parser(kj::ProcessContext& context) override {
    auto builder = kj::MainBuilder(
        context, VERSION_TEXT,
        "Runs BINARY as a job of N replicas, in the foreground: on this machine with the local "
        "launcher (the default), or as one Slurm job of N tasks with --launcher slurm. Prints "
        "the job's and each replica's state as they change, and exits when the job ends (0 "
        "when it succeeded). Ctrl-C stops the job (SIGTERM to each replica, SIGKILL after "
        "10 s; a second Ctrl-C kills at once). Replicas get TROUPE_JOB_ID, TROUPE_TASK_INDEX "
        "(on Slurm: SLURM_PROCID), TROUPE_NUM_TASKS and TROUPE_RESOLVER; their output goes to "
        "DIR/NAME/replica-<i>.log. BINARY and its arguments go after \"--\".");
    builder
        .addOptionWithArg({"name"}, storeIn(name), "NAME",
                          "The job's name and id (default: BINARY's file name).")
        .addOptionWithArg({"replicas"}, KJ_BIND_METHOD(*this, setReplicas), "N",
                          "How many replicas (default 1).")
        .addOptionWithArg({"cpu"}, KJ_BIND_METHOD(*this, setCpu), "C",
                          "Cores reserved per replica (default 0: none; replicas share the "
                          "machine).")
        .addOptionWithArg({"ram"}, storeIn(ram), "SIZE",
                          "Memory reserved per replica (default 0: none).")
        .addOptionWithArg({"gpu"}, KJ_BIND_METHOD(*this, setGpu), "TYPE:COUNT",
                          "GPUs per replica, e.g. H100:8.")
        .addOptionWithArg({"max-retries"}, KJ_BIND_METHOD(*this, setMaxRetries), "N",
                          "Restarts of failed replicas before the job fails (default 0).")
        .addOptionWithArg({"log-dir"}, storeIn(logDir), "DIR",
                          "Where the replicas' logs go (default: $TMPDIR/troupe-<pid>; on "
                          "Slurm, $HOME/.troupe/slurm, which every node must see).")
        .addOptionWithArg(
            {"resolver"}, storeIn(resolver), "URL",
            "Where replicas publish (default: $TROUPE_RESOLVER, else, with the local launcher, "
            "a registry this command runs for the job, whose URL it prints).")
        .addOptionWithArg({"launcher"}, KJ_BIND_METHOD(*this, setLauncher), "local|slurm",
                          "Where the replicas run (default local).")
        .addOptionWithArg({"partition"}, storeIn(partition), "NAME",
                          "Slurm: the partition (default: the cluster's default).")
        .addOptionWithArg({"time"}, KJ_BIND_METHOD(*this, setTime), "DURATION",
                          "Slurm: the job's time limit, rounded up to whole minutes (default: "
                          "the partition's).")
        .expectOneOrMoreArgs("-- BINARY ARGS", [this](kj::StringPtr arg) {
          program.push_back(arg.cStr());
          return true;
        });
    credentialFlags.addTo(builder);
    // MainBuilder hands over the arguments before and after "--" alike; the program must come
    // after it, so that its own options are not read as ours.
    return [this, inner = builder.build()](kj::StringPtr name,
                                           kj::ArrayPtr<const kj::StringPtr> params) mutable {
      afterDoubleDash = nullptr;
      for (size_t i = 0; i < params.size(); ++i) {
        if (params[i] == "--") {
          afterDoubleDash = params.size() - i - 1;
          break;
        }
      }
      inner(name, params);
    };
  }

  // The options that parse their value (MainBuilder's callbacks: true, or a UsageError).
  bool setReplicas(kj::StringPtr text) {
    replicas = static_cast<uint32_t>(parseWhole("--replicas", text, 1));
    return true;
  }
  bool setCpu(kj::StringPtr text) {
    cpu = parseCores("--cpu", text);
    return true;
  }
  bool setGpu(kj::StringPtr text) {
    gpu = parseGpu(text);
    return true;
  }
  bool setMaxRetries(kj::StringPtr text) {
    maxRetries = static_cast<uint32_t>(parseWhole("--max-retries", text));
    return true;
  }
  bool setLauncher(kj::StringPtr text) {
    if (text != "local" && text != "slurm") {
      throw UsageError{kj::str("--launcher is local or slurm, not '", printable(text), "'").cStr()};
    }
    launcherKind = text.cStr();
    return true;
  }
  bool setTime(kj::StringPtr text) {
    timeLimit = parseDuration("--time", text, 1 * kj::MINUTES);
    return true;
  }

  int run() override {
    KJ_IF_MAYBE(after, afterDoubleDash) {
      if (*after != program.size() || program.empty()) afterDoubleDash = nullptr;
    }
    if (afterDoubleDash == nullptr) {
      throw UsageError{"the program to run goes after \"--\": troupe launch [options] -- BINARY"};
    }
    std::vector<std::string> programArgs(program.begin() + 1, program.end());
    JobRequest request{
        .name = name.empty() ? nameFrom(program[0]) : name,
        .entrypoint = Entrypoint::binary(findProgram(program[0]), programArgs),
        .resources = resources(),
        .replicas = replicas,
        .maxRetriesFailure = maxRetries,
    };
    // The replicas prove themselves with what this command does.
    request.environment = credentialFlags.environment();
    resolver = flagOrEnvironment(resolver, "TROUPE_RESOLVER");

    bool onSlurm = launcherKind == "slurm";
    if (!onSlurm && (!partition.empty() || timeLimit != 0 * kj::SECONDS)) {
      throw UsageError{"--partition and --time are for --launcher slurm"};
    }
    if (onSlurm && resolver.empty()) {
      throw UsageError{"--launcher slurm needs --resolver URL (or TROUPE_RESOLVER): the "
                       "replicas run on the cluster's nodes, which must reach it"};
    }

    CommandLoop command(credentialFlags);
    auto& loop = command.loop;
    kj::Own<LocalLauncher> local;
    kj::Own<SlurmLauncher> slurm;
    if (onSlurm) {
      slurm = kj::heap<SlurmLauncher>(loop, SlurmLauncherOptions{.resolver = resolver,
                                                                 .partition = partition,
                                                                 .timeLimit = timeLimit,
                                                                 .logDirectory = logDir});
    } else {
      local = kj::heap<LocalLauncher>(loop,
                                      LocalLauncherOptions{.resolver = resolver,
                                                           .logDirectory = logDir,
                                                           .resolverPatience = RESOLVER_PATIENCE,
                                                           .stopJobsOnSignal = false});
    }
    Launcher& launcher = onSlurm ? static_cast<Launcher&>(*slurm) : *local;
    printf("resolver %s; logs in %s/%s\n", launcher.resolverUrl().c_str(),
           launcher.logDirectory().c_str(), request.name.c_str());
    printf("stop it from anywhere: troupe stop %s --job-token-file %s/%s/job-token\n",
           request.name.c_str(), launcher.logDirectory().c_str(), request.name.c_str());
    auto job = launcher.submit(kj::mv(request));
    Reporter reporter(job);

    int signalled = 0;
    auto interrupt = loop.onSignal({SIGINT, SIGTERM}).then([&](int signum) {
      signalled = signum;
      printf("stopping job %s (again to kill at once)\n", job.id().c_str());
      fflush(stdout);
      auto hurry = loop.onSignal({SIGINT, SIGTERM}).then([&](int) {
        return job.terminate(0 * kj::SECONDS);
      });
      return job.terminate().exclusiveJoin(kj::mv(hurry)).then([]() -> kj::Promise<void> {
        return kj::NEVER_DONE;  // the reporter sees the end
      });
    });
    reporter.follow().exclusiveJoin(kj::mv(interrupt)).wait(loop.waitScope());
    launcher.drain().wait(loop.waitScope());

    auto phase = job.status();
    auto lines = phase == JobPhase::FAILED ? job.logs(10) : std::vector<std::string>{};
    if (!lines.empty()) {
      printf("last lines of its logs:\n");
      for (auto& line : lines) printf("  %s\n", line.c_str());
    }
    if (phase == JobPhase::SUCCEEDED) return 0;
    if (signalled != 0) return 128 + signalled;
    return 1;
  }

private:
  ResourceConfig resources() const {
    if (gpu.first.empty()) return ResourceConfig::withCpu(cpu, ram.c_str());
    return ResourceConfig::withGpu(gpu.first.c_str(), gpu.second, cpu, ram.c_str());
  }

  std::string name;
  uint32_t replicas = 1;
  double cpu = 0;
  std::string ram = "0";
  std::pair<std::string, uint32_t> gpu;
  uint32_t maxRetries = 0;
  std::string logDir;
  std::string resolver;
  std::string launcherKind = "local";
  std::string partition;
  kj::Duration timeLimit = 0 * kj::SECONDS;  // none: the partition's
  CredentialFlags credentialFlags;
  std::vector<std::string> program;   // BINARY, then its arguments
  kj::Maybe<size_t> afterDoubleDash;  // how many arguments followed "--", if one was given
};

}  // namespace

kj::Own<Command> launchCommand() { return kj::heap<LaunchCommand>(); }

}  // namespace troupe::cli
