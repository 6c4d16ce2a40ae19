// troupe launch [options] -- BINARY ARGS...: runs a job on this machine in the foreground.

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "troupe/actor/errors.h"
#include "troupe/actor/event_loop.h"
#include "troupe/jobs/local_launcher.h"
#include "tools/troupe/cli.h"
#include "tools/troupe/commands.h"

namespace troupe::cli {

namespace {

constexpr const char* USAGE =
    "usage: troupe launch [--name NAME] [--replicas N] [--cpu C] [--ram SIZE] [--gpu TYPE:COUNT]\n"
    "                     [--max-retries N] [--log-dir DIR] [--resolver URL] -- BINARY ARGS...\n"
    "Runs BINARY as a job of N replicas (default 1) on this machine with the local launcher, in\n"
    "the foreground: prints the job's and each replica's state as they change, and exits when the\n"
    "job ends (0 when it succeeded). Ctrl-C stops the job (SIGTERM to each replica, SIGKILL after\n"
    "10 s; a second Ctrl-C kills at once). Replicas get TROUPE_JOB_ID, TROUPE_TASK_INDEX,\n"
    "TROUPE_NUM_TASKS and TROUPE_RESOLVER; their output goes to DIR/NAME/replica-<i>.log.\n"
    "  --name NAME        the job's name and id (default: BINARY's file name)\n"
    "  --cpu C            cores per replica (default 1)     --ram SIZE  per replica (default 1g)\n"
    "  --gpu TYPE:COUNT   GPUs per replica, e.g. H100:8\n"
    "  --max-retries N    restarts of failed replicas before the job fails (default 0)\n"
    "  --log-dir DIR      default: $TMPDIR/troupe-<pid>\n"
    "  --resolver URL     where replicas publish (default: $TROUPE_RESOLVER, else a registry\n"
    "                     this command runs for the job, whose URL it prints)\n";

// BINARY as the shell would find it: a name without '/' is looked up in $PATH.
std::string findProgram(const std::string& name) {
  if (name.find('/') != std::string::npos) return name;
  const char* path = getenv("PATH");
  std::string dirs = path != nullptr ? path : "/usr/local/bin:/usr/bin:/bin";
  size_t start = 0;
  while (start <= dirs.size()) {
    auto end = dirs.find(':', start);
    if (end == std::string::npos) end = dirs.size();
    std::string dir = dirs.substr(start, end - start);
    std::string candidate = (dir.empty() ? "." : dir) + "/" + name;
    struct stat st;
    if (stat(candidate.c_str(), &st) == 0 && S_ISREG(st.st_mode) &&
        access(candidate.c_str(), X_OK) == 0) {
      return candidate;
    }
    start = end + 1;
  }
  return name;
}

// A job name from a program's file name: what the name rules allow, the rest as '-'.
std::string nameFrom(const std::string& program) {
  auto slash = program.rfind('/');
  std::string base = slash == std::string::npos ? program : program.substr(slash + 1);
  std::string out;
  for (char c : base) out += (isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' ||
                              c == '-') ? c : '-';
  while (!out.empty() && !isalnum(static_cast<unsigned char>(out[0]))) out.erase(0, 1);
  return out.empty() ? "job" : out.substr(0, 64);
}

ResourceConfig resourcesFrom(const Args& args) {
  double cpu = args.decimal("--cpu", 1);
  auto ram = args.value("--ram", "1g");
  auto gpu = args.value("--gpu");
  if (gpu.empty()) return ResourceConfig::withCpu(cpu, ram.c_str());
  auto colon = gpu.rfind(':');
  if (colon == std::string::npos || colon == 0) throw UsageError{"--gpu needs TYPE:COUNT"};
  char* end = nullptr;
  unsigned long n = strtoul(gpu.c_str() + colon + 1, &end, 10);
  if (end == gpu.c_str() + colon + 1 || *end != '\0' || n == 0 || n > 64) {
    throw UsageError{"--gpu needs TYPE:COUNT with COUNT 1..64, not '" + gpu + "'"};
  }
  return ResourceConfig::withGpu(gpu.substr(0, colon).c_str(), static_cast<uint32_t>(n), cpu,
                                 ram.c_str());
}

// Prints what changed in the job since `shown`.
class Reporter {
public:
  explicit Reporter(JobHandle job) : job(kj::mv(job)) {}

  void report() {
    auto phase = job.status();
    auto reason = job.reason();
    if (phase != lastPhase || reason != lastReason) {
      printf("job %s: %s%s%s\n", job.id().c_str(), toString(phase).cStr(),
             reason.empty() ? "" : ": ", reason.c_str());
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

}  // namespace

int launchCommand(int argc, char** argv) {
  return runCommand("launch", USAGE, [&]() {
    Args args(argc, argv, {},
              {"--name", "--replicas", "--cpu", "--ram", "--gpu", "--max-retries", "--log-dir",
               "--resolver"});
    if (args.has("--help")) {
      fputs(USAGE, stdout);
      return 0;
    }
    if (!args.sawDoubleDash || args.positionalBeforeDoubleDash != 0 ||
        args.positional.empty()) {
      throw UsageError{"the program to run goes after \"--\": troupe launch [options] -- BINARY"};
    }
    auto program = findProgram(args.positional[0]);
    std::vector<std::string> programArgs(args.positional.begin() + 1, args.positional.end());
    JobRequest request{
        .name = args.value("--name", nameFrom(args.positional[0])),
        .entrypoint = Entrypoint::binary(program, programArgs),
        .resources = resourcesFrom(args),
        .replicas = static_cast<uint32_t>(args.number("--replicas", 1, 1)),
        .maxRetriesFailure = static_cast<uint32_t>(args.number("--max-retries", 0)),
    };
    std::string resolver = args.value("--resolver");
    if (resolver.empty() && getenv("TROUPE_RESOLVER") != nullptr) resolver = getenv("TROUPE_RESOLVER");

    EventLoop loop;
    LocalLauncher launcher(loop, {.resolver = resolver,
                                  .logDirectory = args.value("--log-dir"),
                                  .stopJobsOnSignal = false});
    printf("resolver %s; logs in %s/%s\n", launcher.resolverUrl().c_str(),
           launcher.logDirectory().c_str(), request.name.c_str());
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
    launcher.shutdown().wait(loop.waitScope());

    auto phase = job.status();
    if (phase == JobPhase::FAILED) {
      printf("last lines of its logs:\n");
      for (auto& line : job.logs(10)) printf("  %s\n", line.c_str());
    }
    if (phase == JobPhase::SUCCEEDED) return 0;
    if (signalled != 0) return 128 + signalled;
    return 1;
  });
}

}  // namespace troupe::cli
