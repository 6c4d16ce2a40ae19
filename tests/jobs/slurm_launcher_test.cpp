// SlurmLauncher against the one-node Slurm cluster of scripts/slurm-local.sh (real munged,
// slurmctld and slurmd; ctest starts it, SLURM_CONF names it): a job of three replicas that
// publishes in a registry and is called through a pool, troupe's environment and Slurm's task
// index, a FUNCTION entrypoint with its arguments verbatim, a request larger than the node or
// for GPUs it lacks, a second job pending behind the first, a failed task requeued and then
// failing the job, terminate with a replica that ignores SIGTERM, a job cancelled behind the
// launcher's back, each task's log, a launcher made again that finds its running job, a restart
// of slurmctld, and a launcher without sbatch or a resolver.
//
// Slurm pushes nothing and its scheduler runs in real time, so these tests use real time: they
// wait for the phases they expect (or PATIENCE, failing).

#include "troupe/jobs/slurm_launcher.h"

#include <stdio.h>

#include <set>
#include <string>

#include <gtest/gtest.h>
#include <spdlog/sinks/stdout_sinks.h>

#include "troupe/pool/actor_pool.h"
#include "troupe/resolver/open_resolver.h"
#include "troupe/resolver/registry_server.h"
#include "tests/support/launcher_helpers.h"
#include "tests/support/registry_helpers.h"
#include "tests/support/test_actors.h"

namespace troupe {
namespace {

using test::await;
using test::awaitError;
using test::PATIENCE;

// What a shell command printed (the test's own use of Slurm's commands, as a user would).
std::string shell(const std::string& command) {
  std::string out;
  FILE* p = popen(command.c_str(), "r");
  if (p == nullptr) return out;
  char buffer[4096];
  size_t n;
  while ((n = fread(buffer, 1, sizeof(buffer), p)) > 0) out.append(buffer, n);
  pclose(p);
  while (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

// What scripts/slurm-local.sh COMMAND printed for the test's cluster, and whether it succeeded.
std::pair<bool, std::string> slurmLocal(const std::string& command) {
  std::string conf = getenv("SLURM_CONF");
  auto out = shell(std::string(TROUPE_SLURM_LOCAL_PATH) + " " + command + " " +
                   conf.substr(0, conf.rfind('/')) + " 2>&1 && echo ' ok'");
  bool ok = out.size() >= 3 && out.substr(out.size() - 3) == " ok";
  return {ok, out};
}

// FIELD=value in `scontrol -o show job ID`: the value.
std::string jobField(uint64_t id, const std::string& field) {
  return shell("scontrol -o show job " + std::to_string(id) + " | tr ' ' '\\n' | sed -n 's/^" +
               field + "=//p'");
}

// The cores the cluster's node offers.
uint32_t nodeCpus() {
  return static_cast<uint32_t>(std::stoul(shell("sinfo --noheader --format=%c")));
}

class SlurmLauncherTest : public ::testing::Test {
protected:
  SlurmLauncherTest() : sink(std::make_shared<test::LineSink>()), registry(loop) {
    registry.listen(("unix:" + dir.path + "/registry.sock").c_str());
    url = "registry+unix:" + dir.path + "/registry.sock";
    launcher = makeLauncher();
  }

  kj::Own<SlurmLauncher> makeLauncher() { return kj::heap<SlurmLauncher>(loop, options()); }

  SlurmLauncherOptions options() {
    return SlurmLauncherOptions{.resolver = url,
                                .logDirectory = dir.path + "/logs",
                                .terminateGrace = 5 * kj::SECONDS,
                                .pollInitial = 100 * kj::MILLISECONDS,
                                .pollMax = 1 * kj::SECONDS,
                                .logger = logger()};
  }
  ~SlurmLauncherTest() noexcept override {
    // Nothing a test submitted outlives it.
    KJ_IF_MAYBE(e, kj::runCatchingExceptions(
                       [&]() { launcher->drain(1 * kj::SECONDS).wait(loop.waitScope()); })) {
      ADD_FAILURE() << "drain: " << e->getDescription().cStr();
    }
  }

  // The launcher's lines go to the sink (for the test to count) and to stderr (for ctest to
  // show when a test fails).
  std::shared_ptr<spdlog::logger> logger() {
    auto both = std::make_shared<spdlog::logger>(
        "slurm", spdlog::sinks_init_list{sink, std::make_shared<spdlog::sinks::stderr_sink_mt>()});
    both->set_level(spdlog::level::debug);
    return both;
  }

  static JobRequest request(std::string name, Entrypoint entrypoint, uint32_t replicas = 1,
                            double cpus = 1) {
    return test::jobRequest(kj::mv(name), kj::mv(entrypoint), replicas, cpus);
  }

  // The replica program (tests/support/test_replica_main.cpp) running `args`.
  static Entrypoint replica(std::vector<std::string> args) {
    return Entrypoint::binary(TROUPE_TEST_REPLICA_PATH, kj::mv(args));
  }

  JobPhase finalPhase(JobHandle& job) { return await(loop, job.wait(PATIENCE)); }

  void awaitPhase(JobHandle& job, JobPhase phase) {
    while (job.status() != phase && !isFinal(job.status())) await(loop, job.whenChanged());
  }

  EventLoop loop;
  test::TempDir dir;
  std::shared_ptr<test::LineSink> sink;
  RegistryServer registry;
  std::string url;
  kj::Own<SlurmLauncher> launcher;
};

TEST_F(SlurmLauncherTest, AJobOfThreeReplicasPublishesAndIsCalledThroughAPool) {
  auto group = createActorGroup<test::Member>(
      *launcher, request("members", Entrypoint::binary(TROUPE_TEST_HOST_ACTOR_PATH), 3), "member");
  auto& job = group.job;
  auto ready = await(loop, group->waitReady(3, PATIENCE));
  ASSERT_EQ(ready.size(), 3u);
  EXPECT_GT(launcher->slurmJobId("members"), 0u);  // submitted, since its replicas run
  awaitPhase(job, JobPhase::RUNNING);              // the launcher sees it at its next look at Slurm
  EXPECT_EQ(job.status(), JobPhase::RUNNING) << job.reason();

  ActorPool<test::Member> pool(*group);
  auto names = test::memberNames(loop, pool, PATIENCE);
  // Each task's index is its SLURM_PROCID.
  EXPECT_EQ(names,
            (std::set<std::string>{"members/member-0", "members/member-1", "members/member-2"}));

  // Terminating the job ends it in the resolver: the group learns, and waiting fails fast.
  await(loop, job.terminate());
  EXPECT_EQ(job.status(), JobPhase::STOPPED);
  EXPECT_EQ(job.reason(), "terminated");
  while (group->jobEnded() == nullptr) await(loop, group->whenChanged());
  auto failure = awaitError(loop, group->waitReady(1, PATIENCE));
  EXPECT_EQ(failure.code, ErrorCode::JOB_ENDED) << failure.text;
}

TEST_F(SlurmLauncherTest, TheReplicasGetTroupesEnvironmentAndSlurmsTaskIndex) {
  auto req = request("env", replica({"env", "SLURM_PROCID", "SLURM_NTASKS", "EXTRA"}), 2);
  req.environment["EXTRA"] = "from the request";
  auto job = launcher->submit(kj::mv(req));
  ASSERT_EQ(finalPhase(job), JobPhase::SUCCEEDED) << job.reason();
  for (int i = 0; i < 2; ++i) {
    auto prefix = "[" + std::to_string(i) + "] ";
    auto lines = job.logs(100);
    auto has = [&](const std::string& line) {
      return std::find(lines.begin(), lines.end(), prefix + line) != lines.end();
    };
    EXPECT_TRUE(has("TROUPE_JOB_ID=env"));
    EXPECT_TRUE(has("TROUPE_NUM_TASKS=2"));
    EXPECT_TRUE(has("TROUPE_RESOLVER=" + url));
    EXPECT_TRUE(has("TROUPE_TASK_INDEX unset"));  // JobContext reads SLURM_PROCID
    EXPECT_TRUE(has("SLURM_PROCID=" + std::to_string(i)));
    EXPECT_TRUE(has("SLURM_NTASKS=2"));
    EXPECT_TRUE(has("EXTRA=from the request"));
  }
}

TEST_F(SlurmLauncherTest, AFunctionEntrypointRunsInEachTaskWithItsArgumentsVerbatim) {
  // This test program is also what the tasks run (jobs_test_main.cpp); no shell reads the
  // arguments on the way.
  auto job = launcher->submit(request(
      "function", Entrypoint::function("print-args", {"two words", "$(echo injected)", ""}), 2));
  ASSERT_EQ(finalPhase(job), JobPhase::SUCCEEDED) << job.reason();
  for (std::string task : {"[0] ", "[1] "}) {
    auto lines = job.logs(100);
    std::vector<std::string> expected{
        task + "ARGS 3", task + "[two words]", task + "[$(echo injected)]",
        task + "[]",     task + "TASK ?",      task + "TROUPE_ENTRYPOINT unset"};
    std::vector<std::string> mine;
    for (auto& line : lines) {
      if (line.rfind(task, 0) == 0) mine.push_back(line);
    }
    EXPECT_EQ(mine, expected);
  }
}

TEST_F(SlurmLauncherTest, ARequestLargerThanTheNodeIsUnschedulableAtOnce) {
  auto job = launcher->submit(request("huge", replica({"exit", "0"}), 1, nodeCpus() * 4));
  ASSERT_EQ(finalPhase(job), JobPhase::UNSCHEDULABLE);
  EXPECT_NE(job.reason().find("Requested node configuration is not available"), std::string::npos)
      << job.reason();
  EXPECT_EQ(launcher->slurmJobId("huge"), 0u);  // never submitted
  auto status = await(loop, launcher->resolver().jobStatus("huge"));
  EXPECT_EQ(status.state, JobState::ENDED);
  EXPECT_EQ(status.reason.rfind("unschedulable: ", 0), 0u) << status.reason;
}

TEST_F(SlurmLauncherTest, GpusTheNodeLacksAreUnschedulableAtOnceNamingSlurmsRefusal) {
  auto req = request("gpus", replica({"exit", "0"}), 2);
  req.resources = ResourceConfig::withGpu("H100", 8, 1, "64m");
  auto job = launcher->submit(kj::mv(req));
  ASSERT_EQ(finalPhase(job), JobPhase::UNSCHEDULABLE);
  EXPECT_NE(job.reason().find("gres"), std::string::npos) << job.reason();
  EXPECT_EQ(launcher->slurmJobId("gpus"), 0u);
}

TEST_F(SlurmLauncherTest, ASecondJobWaitsPendingUntilTheFirstEnds) {
  auto first = launcher->submit(request("first", replica({"wait"}), nodeCpus()));
  awaitPhase(first, JobPhase::RUNNING);
  ASSERT_EQ(first.status(), JobPhase::RUNNING) << first.reason();
  auto second = launcher->submit(request("second", replica({"exit", "0"})));
  while (second.reason().find(": Resources") == std::string::npos &&
         second.reason().find(": Priority") == std::string::npos) {
    ASSERT_EQ(second.status(), JobPhase::PENDING) << second.reason();
    await(loop, second.whenChanged());
  }
  await(loop, first.terminate());
  EXPECT_EQ(first.status(), JobPhase::STOPPED);
  EXPECT_EQ(finalPhase(second), JobPhase::SUCCEEDED) << second.reason();
}

TEST_F(SlurmLauncherTest, AFailedTaskIsRequeuedThenPastTheLimitTheJobFails) {
  auto req = request("failing", replica({"task-exit", "1", "3"}), 2);
  req.maxRetriesFailure = 1;
  auto job = launcher->submit(kj::mv(req));
  ASSERT_EQ(finalPhase(job), JobPhase::FAILED);
  EXPECT_NE(job.reason().find("task 1: Exited with exit code 3"), std::string::npos)
      << job.reason();
  EXPECT_EQ(job.replicas()[1].starts, 2u);  // requeued once
  EXPECT_EQ(sink->count("requeued (restart 1 of at most 1)"), 1u);
  auto status = await(loop, launcher->resolver().jobStatus("failing"));
  EXPECT_EQ(status.state, JobState::ENDED);
  EXPECT_EQ(status.reason.rfind("failed: ", 0), 0u) << status.reason;
}

TEST_F(SlurmLauncherTest, TerminateCancelsAReplicaThatIgnoresSigtermAfterTheGrace) {
  auto job = launcher->submit(request("stubborn", replica({"wait", "--ignore-term"}), 2));
  awaitPhase(job, JobPhase::RUNNING);
  ASSERT_EQ(job.status(), JobPhase::RUNNING) << job.reason();
  await(loop, job.terminate(1 * kj::SECONDS));
  EXPECT_EQ(job.status(), JobPhase::STOPPED);
  EXPECT_EQ(sink->count("still runs after its grace; cancelling it"), 1u);
  auto slurmState = shell("scontrol -o show job " +
                          std::to_string(launcher->slurmJobId("stubborn")) +
                          " | sed -n 's/.* JobState=\\([A-Z_]*\\) .*/\\1/p'");
  EXPECT_TRUE(slurmState == "CANCELLED" || slurmState == "COMPLETED") << slurmState;
}

TEST_F(SlurmLauncherTest, AJobCancelledBehindTheLaunchersBackEndsStopped) {
  auto job = launcher->submit(request("cancelled", replica({"wait"})));
  awaitPhase(job, JobPhase::RUNNING);
  ASSERT_EQ(job.status(), JobPhase::RUNNING) << job.reason();
  shell("scancel " + std::to_string(launcher->slurmJobId("cancelled")));
  ASSERT_EQ(finalPhase(job), JobPhase::STOPPED);
  EXPECT_EQ(job.reason(), "cancelled in Slurm (scancel, or an administrator)");
}

TEST_F(SlurmLauncherTest, LogsHoldEachTasksOutput) {
  auto job = launcher->submit(request("chatty", replica({"lines", "3"}), 2));
  ASSERT_EQ(finalPhase(job), JobPhase::SUCCEEDED) << job.reason();
  auto lines = job.logs(2);
  EXPECT_EQ(lines,
            (std::vector<std::string>{"[0] line 3", "[0] err done", "[1] line 3", "[1] err done"}));
  EXPECT_EQ(test::grepLogs(job, "line 1").size(), 2u);
}

TEST_F(SlurmLauncherTest, ALauncherMadeAgainFindsItsRunningJobAndEndsIt) {
  auto job = launcher->submit(request("survivor", replica({"wait"}), 2));
  awaitPhase(job, JobPhase::RUNNING);
  ASSERT_EQ(job.status(), JobPhase::RUNNING) << job.reason();
  auto id = launcher->slurmJobId("survivor");

  launcher = nullptr;  // as when the launcher's process exits: the job runs on in Slurm
  EXPECT_EQ(job.reason(), "the launcher was destroyed; the job runs on in Slurm");
  launcher = makeLauncher();

  // The name is taken while the job runs; find() takes the job over.
  auto refused = test::thrownBy([&]() {
    launcher->submit(request("survivor", replica({"exit", "0"})));
  });
  EXPECT_EQ(refused.code, ErrorCode::JOB_ALREADY_EXISTS);
  EXPECT_TRUE(refused.mentions(("runs already as Slurm job " + std::to_string(id)).c_str()))
      << refused.text;
  auto found = KJ_ASSERT_NONNULL(launcher->find("survivor"));
  EXPECT_EQ(launcher->slurmJobId("survivor"), id);
  EXPECT_EQ(found.replicas().size(), 2u);
  awaitPhase(found, JobPhase::RUNNING);
  EXPECT_EQ(found.status(), JobPhase::RUNNING) << found.reason();

  // Ending it ends it in the resolver too: the credential came back from its token file.
  await(loop, found.terminate());
  EXPECT_EQ(found.status(), JobPhase::STOPPED);
  auto status = await(loop, launcher->resolver().jobStatus("survivor"));
  EXPECT_EQ(status, (JobStatus{"survivor", JobState::ENDED, "stopped: terminated"}));
}

TEST_F(SlurmLauncherTest, AJobRunsOnThroughARestartOfSlurmctld) {
  auto job = launcher->submit(request("steady", replica({"wait"}), 2));
  awaitPhase(job, JobPhase::RUNNING);
  ASSERT_EQ(job.status(), JobPhase::RUNNING) << job.reason();
  auto [restarted, said] = slurmLocal("restart-controller");
  ASSERT_TRUE(restarted) << said;
  EXPECT_EQ(jobField(launcher->slurmJobId("steady"), "JobState"), "RUNNING");
  // The launcher goes on following it through the restarted controller.
  EXPECT_EQ(job.status(), JobPhase::RUNNING) << job.reason();
  await(loop, job.terminate());
  EXPECT_EQ(job.status(), JobPhase::STOPPED) << job.reason();
}

TEST_F(SlurmLauncherTest, ASubmissionWhileSlurmctldIsDownWaitsForItThenRunsOnce) {
  auto [stopped, said] = slurmLocal("stop-controller");
  ASSERT_TRUE(stopped) << said;
  // Whatever happens below, the next test finds a controller.
  KJ_DEFER(slurmLocal("start-controller"));
  auto job = launcher->submit(request("patient", replica({"exit", "0"}), 2));
  while (job.reason().find("slurmctld cannot be reached") == std::string::npos) {
    ASSERT_EQ(job.status(), JobPhase::PENDING) << job.reason();
    await(loop, job.whenChanged());
  }
  EXPECT_NE(job.reason().find("Unable to contact slurm controller"), std::string::npos)
      << job.reason();
  auto [started, startSaid] = slurmLocal("start-controller");
  ASSERT_TRUE(started) << startSaid;
  ASSERT_EQ(finalPhase(job), JobPhase::SUCCEEDED) << job.reason();
  // Submitted once: Slurm holds one job of that name.
  EXPECT_EQ(shell("squeue --noheader --states=all --name=patient --format=%i | wc -l"), "1");
  EXPECT_GE(sink->count("slurmctld cannot be reached; submitting again"), 1u);
}

TEST_F(SlurmLauncherTest, TerminateEndsASubmissionWaitingForSlurmctldAtOnce) {
  auto [stopped, said] = slurmLocal("stop-controller");
  ASSERT_TRUE(stopped) << said;
  KJ_DEFER(slurmLocal("start-controller"));
  auto job = launcher->submit(request("abandoned", replica({"exit", "0"})));
  while (job.reason().find("slurmctld cannot be reached") == std::string::npos) {
    ASSERT_EQ(job.status(), JobPhase::PENDING) << job.reason();
    await(loop, job.whenChanged());
  }
  await(loop, job.terminate());
  EXPECT_EQ(job.status(), JobPhase::STOPPED) << job.reason();
  EXPECT_EQ(launcher->slurmJobId("abandoned"), 0u);
}

TEST_F(SlurmLauncherTest, APreemptibleJobIsRequeuableAndComesBackAfterAPreemption) {
  auto req = request("spot", replica({"wait"}), 2);
  req.resources.preemptible = true;
  auto job = launcher->submit(kj::mv(req));
  auto plain = launcher->submit(request("plain", replica({"wait"})));
  awaitPhase(job, JobPhase::RUNNING);
  awaitPhase(plain, JobPhase::RUNNING);
  ASSERT_EQ(job.status(), JobPhase::RUNNING) << job.reason();
  auto id = launcher->slurmJobId("spot");
  EXPECT_EQ(jobField(id, "Requeue"), "1");
  EXPECT_EQ(jobField(launcher->slurmJobId("plain"), "Requeue"), "0");

  // What a preemption with PreemptMode=REQUEUE does, by hand; then made eligible at once
  // (Slurm holds a requeued job back two minutes).
  shell("scontrol requeue " + std::to_string(id));
  while (job.status() == JobPhase::RUNNING) await(loop, job.whenChanged());
  EXPECT_EQ(job.status(), JobPhase::PENDING) << job.reason();
  shell("scontrol update JobId=" + std::to_string(id) + " StartTime=now");
  while (job.status() != JobPhase::RUNNING) {
    ASSERT_EQ(job.status(), JobPhase::PENDING) << job.reason();
    await(loop, job.whenChanged());
  }
  EXPECT_EQ(job.replicas()[0].starts, 2u);
  EXPECT_EQ(launcher->slurmJobId("spot"), id);
  await(loop, job.terminate());
  await(loop, plain.terminate());
  EXPECT_EQ(job.status(), JobPhase::STOPPED) << job.reason();
}

TEST(SlurmLauncherSetupTest, WithoutSbatchOrAResolverTheLauncherIsRefusedClearly) {
  EventLoop loop;
  test::TempDir dir;
  auto noResolver = test::thrownBy(
      [&]() { SlurmLauncher launcher(loop, SlurmLauncherOptions{.logDirectory = dir.path}); });
  EXPECT_EQ(noResolver.code, ErrorCode::INVALID_ARGUMENT);
  EXPECT_TRUE(noResolver.mentions("resolver is required")) << noResolver.text;

  std::string path = getenv("PATH");
  setenv("PATH", dir.path.c_str(), 1);
  auto noSbatch = test::thrownBy([&]() {
    SlurmLauncher launcher(loop, SlurmLauncherOptions{.resolver = "registry://127.0.0.1:1",
                                                      .logDirectory = dir.path});
  });
  setenv("PATH", path.c_str(), 1);
  EXPECT_EQ(noSbatch.code, ErrorCode::FAILED);
  EXPECT_TRUE(noSbatch.mentions("the Slurm command 'sbatch' is not on PATH")) << noSbatch.text;
}

}  // namespace
}  // namespace troupe
