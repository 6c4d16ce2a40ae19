// LocalLauncher: replicas as child processes, their environment and logs, gang admission,
// restarts and failures, terminate, duplicate names, and createActorGroup end to end.

#include <signal.h>
#include <sys/stat.h>

#include <fstream>
#include <set>

#include <gtest/gtest.h>

#include "troupe/pool/actor_pool.h"
#include "troupe/resolver/open_resolver.h"
#include "troupe/resolver/registry_server.h"
#include "tests/jobs/launcher_fixture.h"
#include "tests/support/test_actors.h"

namespace troupe {
namespace {

using test::await;
using test::awaitError;
using test::gone;
using test::PATIENCE;
using test::PhaseRecorder;
using test::thrownBy;

using LocalLauncherTest = test::LauncherTest;

// On a manual clock, for a timeout or grace period timed in this process: it ends when the test
// moves time past it. The replicas are real processes all the same.
class LocalLauncherClockTest : public test::LauncherTest {
protected:
  LocalLauncherClockTest() : LauncherTest({.manualClock = true}) {}
};

bool contains(const std::vector<std::string>& lines, const std::string& line) {
  return std::find(lines.begin(), lines.end(), line) != lines.end();
}

TEST_F(LocalLauncherTest, ReplicasGetTroupeAndDeviceVariablesAndTheUsersWin) {
  auto& launcher = start();
  auto req = request("env", replica({"env", "EXTRA"}), 2);
  req.environment = {{"EXTRA", "from the user"}, {"JAX_PLATFORMS", "cuda"}};
  auto job = launcher.submit(kj::mv(req));
  ASSERT_EQ(finalPhase(job), JobPhase::SUCCEEDED) << job.reason();

  auto lines = job.logs(100);
  std::string resolver = "TROUPE_RESOLVER=" + launcher.resolverUrl();
  for (std::string i : {"0", "1"}) {
    auto p = "[" + i + "] ";
    EXPECT_TRUE(contains(lines, p + "TROUPE_JOB_ID=env")) << i;
    EXPECT_TRUE(contains(lines, p + "TROUPE_TASK_INDEX=" + i)) << i;
    EXPECT_TRUE(contains(lines, p + "TROUPE_NUM_TASKS=2")) << i;
    EXPECT_TRUE(contains(lines, p + resolver)) << i;
    EXPECT_TRUE(contains(lines, p + "EXTRA=from the user")) << i;
    // The device says "cpu"; the user's value wins.
    EXPECT_TRUE(contains(lines, p + "JAX_PLATFORMS=cuda")) << i;
    EXPECT_TRUE(contains(lines, p + "LIBTPU_INIT_ARGS unset")) << i;
    EXPECT_TRUE(contains(lines, p + "TROUPE_ENTRYPOINT unset")) << i;
  }
  // The launcher's embedded registry, since the options named none.
  EXPECT_EQ(launcher.resolverUrl().rfind("registry+unix:", 0), 0u) << launcher.resolverUrl();
}

TEST_F(LocalLauncherTest, CpuReplicasGetJaxOnCpuAndGpuReplicasTheirOwnGpus) {
  auto o = options();
  o.gpus = 3;
  auto& launcher = start(kj::mv(o));
  auto cpuJob = launcher.submit(request("cpu", replica({"env"})));
  JobRequest gpuRequest{.name = "gpu",
                        .entrypoint = replica({"env"}),
                        .resources = ResourceConfig::withGpu("H100", 1, 1, "64m"),
                        .replicas = 2};
  auto gpuJob = launcher.submit(kj::mv(gpuRequest));
  ASSERT_EQ(finalPhase(cpuJob), JobPhase::SUCCEEDED) << cpuJob.reason();
  ASSERT_EQ(finalPhase(gpuJob), JobPhase::SUCCEEDED) << gpuJob.reason();

  auto cpuLines = cpuJob.logs(100);
  EXPECT_TRUE(contains(cpuLines, "[0] JAX_PLATFORMS=cpu"));
  // On a machine with GPUs, a replica given none sees none.
  EXPECT_TRUE(contains(cpuLines, "[0] CUDA_VISIBLE_DEVICES="));

  auto gpuLines = gpuJob.logs(100);
  EXPECT_TRUE(contains(gpuLines, "[0] JAX_PLATFORMS="));
  EXPECT_TRUE(contains(gpuLines, "[1] JAX_PLATFORMS="));
  std::set<std::string> devices;
  for (auto& line : test::LauncherTest::grep(gpuJob, "CUDA_VISIBLE_DEVICES=")) {
    devices.insert(line.substr(line.find('=') + 1));
  }
  EXPECT_EQ(devices, (std::set<std::string>{"0", "1"}));
}

TEST_F(LocalLauncherTest, LogsKeepEachReplicasOutputAndErrors) {
  auto& launcher = start();
  auto job = launcher.submit(request("lines", replica({"lines", "50"}), 2));
  ASSERT_EQ(finalPhase(job), JobPhase::SUCCEEDED) << job.reason();
  EXPECT_EQ(job.logs(3), (std::vector<std::string>{"[0] line 49", "[0] line 50", "[0] err done",
                                                   "[1] line 49", "[1] line 50", "[1] err done"}));
  // The whole file: a start marker, then everything the replica wrote.
  auto all = job.logs(1000);
  ASSERT_EQ(all.size(), 2u * 52u);
  EXPECT_EQ(all[0].rfind("[0] --- troupe: job lines, replica 0, start 1", 0), 0u) << all[0];
  auto replicas = job.replicas();
  ASSERT_EQ(replicas.size(), 2u);
  EXPECT_EQ(replicas[1].logPath, dir.path + "/lines/replica-1.log");
  EXPECT_EQ(replicas[1].pid, 0);  // exited
  EXPECT_EQ(replicas[1].starts, 1u);
}

TEST_F(LocalLauncherTest, ASuccessfulJobGoesRunningThenSucceededAndTellsTheResolver) {
  auto& launcher = start();
  auto job = launcher.submit(request("ok", replica({"exit", "0"}), 3));
  PhaseRecorder phases(job);
  ASSERT_EQ(finalPhase(job), JobPhase::SUCCEEDED);
  EXPECT_EQ(phases.text(), "running,succeeded");
  EXPECT_EQ(job.reason(), "");
  EXPECT_EQ(job.id(), "ok");

  // The job's end reaches the resolver: a group of it fails at once.
  ActorGroup<test::Member> group(loop, launcher.resolver(), "ok", "member");
  auto failure = awaitError(loop, group.waitReady(1, PATIENCE));
  EXPECT_EQ(failure.code, ErrorCode::JOB_ENDED) << failure.text;
  EXPECT_TRUE(failure.mentions("succeeded")) << failure.text;
}

TEST_F(LocalLauncherTest, AFailingReplicaIsRestartedUntilTheRetryLimitThenTheJobFails) {
  auto& launcher = start();
  auto req = request("flaky", replica({"exit", "3"}));
  req.maxRetriesFailure = 2;
  auto job = launcher.submit(kj::mv(req));
  ASSERT_EQ(finalPhase(job), JobPhase::FAILED);
  EXPECT_NE(job.reason().find("exited with status 3"), std::string::npos) << job.reason();
  EXPECT_NE(job.reason().find("maxRetriesFailure is 2"), std::string::npos) << job.reason();
  EXPECT_EQ(job.replicas()[0].starts, 3u);
  EXPECT_EQ(grep(job, "--- troupe: job flaky, replica 0, start").size(), 3u);
  EXPECT_EQ(grep(job, "start 3 (its previous run exited with status 3)").size(), 1u);
  // Its share of the machine is back.
  EXPECT_EQ(launcher.available(), launcher.machine());
}

TEST_F(LocalLauncherTest, AFailureEndsTheOtherReplicasToo) {
  auto& launcher = start();
  auto job = launcher.submit(request("partial", replica({"task-exit", "1", "7"}), 3));
  ASSERT_EQ(finalPhase(job), JobPhase::FAILED);
  EXPECT_NE(job.reason().find("replica 1"), std::string::npos) << job.reason();
  for (auto& r : job.replicas()) EXPECT_EQ(r.pid, 0) << r.index;
}

TEST_F(LocalLauncherTest, AProgramThatCannotRunFailsTheJobWithTheReason) {
  auto& launcher = start();
  auto missing = launcher.submit(request("missing", Entrypoint::binary(dir.path + "/nothing")));
  ASSERT_EQ(finalPhase(missing), JobPhase::FAILED);
  EXPECT_NE(missing.reason().find("no such file or directory"), std::string::npos)
      << missing.reason();
  EXPECT_NE(missing.reason().find(dir.path + "/nothing"), std::string::npos) << missing.reason();

  std::string script = dir.path + "/not-executable";
  std::ofstream(script) << "#!/bin/sh\nexit 0\n";
  ASSERT_EQ(::chmod(script.c_str(), 0644), 0);
  auto denied = launcher.submit(request("denied", Entrypoint::binary(script)));
  ASSERT_EQ(finalPhase(denied), JobPhase::FAILED);
  EXPECT_NE(denied.reason().find("permission denied"), std::string::npos) << denied.reason();
  EXPECT_EQ(launcher.available(), launcher.machine());
}

TEST_F(LocalLauncherTest, MalformedRequestsAreRefusedWithTheReason) {
  auto& launcher = start();
  auto badName = thrownBy([&]() { launcher.submit(request("a/b", replica({"exit", "0"}))); });
  EXPECT_EQ(badName.code, ErrorCode::INVALID_ARGUMENT);
  EXPECT_TRUE(badName.mentions("a/b")) << badName.text;
  auto noProgram = thrownBy([&]() { launcher.submit(request("p", Entrypoint::binary(""))); });
  EXPECT_EQ(noProgram.code, ErrorCode::INVALID_ARGUMENT) << noProgram.text;
  EXPECT_TRUE(launcher.find("p") == nullptr);
}

TEST_F(LocalLauncherTest, AJobLargerThanTheMachineIsUnschedulableAtOnce) {
  auto& launcher = start();
  auto job = launcher.submit(request("huge", replica({"exit", "0"}), 5, 1));
  EXPECT_EQ(job.status(), JobPhase::UNSCHEDULABLE);
  EXPECT_NE(job.reason().find("needs 5 x 1 cpu,"), std::string::npos) << job.reason();
  EXPECT_NE(job.reason().find("the machine has 4 cpus"), std::string::npos) << job.reason();
  // It ends in the resolver with its reason: waiting for its members fails at once, saying why.
  ActorGroupBase group(loop, launcher.resolver(), "huge", "member");
  auto never = awaitError(loop, group.waitReady(5, 10 * test::PATIENCE));
  EXPECT_EQ(never.code, ErrorCode::JOB_ENDED) << never.text;
  EXPECT_TRUE(never.mentions("unschedulable: needs 5 x 1 cpu")) << never.text;

  JobRequest tpu{.name = "tpu",
                 .entrypoint = replica({"exit", "0"}),
                 .resources = ResourceConfig::withTpu("v5p-8")};
  auto tpuJob = launcher.submit(kj::mv(tpu));
  EXPECT_EQ(tpuJob.status(), JobPhase::UNSCHEDULABLE);
  EXPECT_NE(tpuJob.reason().find("tpu v5p-8"), std::string::npos) << tpuJob.reason();

  JobRequest ram{.name = "ram",
                 .entrypoint = replica({"exit", "0"}),
                 .resources = ResourceConfig::withCpu(1, "9g")};
  EXPECT_EQ(launcher.submit(kj::mv(ram)).status(), JobPhase::UNSCHEDULABLE);
  EXPECT_EQ(launcher.available(), launcher.machine());
}

TEST_F(LocalLauncherTest, AJobWaitsPendingForCapacityAndStartsWhenAnotherEnds) {
  auto& launcher = start();
  auto first = launcher.submit(request("first", replica({"wait"}), 2, 1.5));  // 3 of 4 cpus
  ASSERT_EQ(first.status(), JobPhase::RUNNING);
  awaitStarted(first);

  auto second = launcher.submit(request("second", replica({"exit", "0"}), 2, 1));
  PhaseRecorder phases(second);
  EXPECT_EQ(second.status(), JobPhase::PENDING);
  EXPECT_NE(second.reason().find("needs 2 x 1 cpu, 1 of 4 cpus free"), std::string::npos)
      << second.reason();
  for (auto& r : second.replicas()) EXPECT_EQ(r.pid, 0);
  // A later job that would fit waits behind it (first come, first served).
  auto third = launcher.submit(request("third", replica({"exit", "0"}), 1, 1));
  EXPECT_EQ(third.status(), JobPhase::PENDING);
  EXPECT_NE(third.reason().find("'second'"), std::string::npos) << third.reason();

  await(loop, first.terminate());
  EXPECT_EQ(first.status(), JobPhase::STOPPED);
  EXPECT_EQ(finalPhase(second), JobPhase::SUCCEEDED) << second.reason();
  EXPECT_EQ(phases.text(), "pending,running,succeeded");
  EXPECT_EQ(finalPhase(third), JobPhase::SUCCEEDED) << third.reason();
  EXPECT_EQ(launcher.available(), launcher.machine());
}

TEST_F(LocalLauncherTest, BackfillLetsALaterJobThatFitsGoFirst) {
  auto o = options();
  o.backfill = true;
  auto& launcher = start(kj::mv(o));
  auto first = launcher.submit(request("first", replica({"wait"}), 1, 3));
  auto big = launcher.submit(request("big", replica({"exit", "0"}), 1, 2));
  auto small = launcher.submit(request("small", replica({"exit", "0"}), 1, 1));
  EXPECT_EQ(big.status(), JobPhase::PENDING);
  EXPECT_EQ(finalPhase(small), JobPhase::SUCCEEDED);
  EXPECT_EQ(big.status(), JobPhase::PENDING);
  await(loop, first.terminate());
  EXPECT_EQ(finalPhase(big), JobPhase::SUCCEEDED);
}

TEST_F(LocalLauncherClockTest, TerminateLeavesNoProcessEvenOneIgnoringSigterm) {
  auto o = options();
  o.terminateGrace = 200 * kj::MILLISECONDS;
  auto& launcher = start(kj::mv(o));
  test::NotifyFifo notify(loop, dir.path);
  auto req = request("held", replica({"wait", "--ignore-term", "--grandchild"}), 2);
  req.environment.insert(notify.variable());
  auto job = launcher.submit(kj::mv(req));

  std::vector<pid_t> pids;
  for (int i = 0; i < 2; ++i) {
    auto line = await(loop, notify.readLine());  // "STARTED <index> <pid> <grandchild>"
    int index = 0, pid = 0, grandchild = 0;
    ASSERT_EQ(sscanf(line.c_str(), "STARTED %d %d %d", &index, &pid, &grandchild), 3) << line;
    ASSERT_GT(grandchild, 0);
    pids.push_back(pid);
    pids.push_back(grandchild);
  }
  for (auto pid : pids) ASSERT_FALSE(gone(pid)) << pid;

  // SIGTERM now, which they ignore; SIGKILL once the grace period is over.
  auto terminated = job.terminate();
  loop.advanceTime(200 * kj::MILLISECONDS - 1 * kj::NANOSECONDS);
  EXPECT_FALSE(terminated.poll(loop.waitScope())) << "ended before the grace period";
  EXPECT_NE(job.status(), JobPhase::STOPPED);
  loop.advanceTime(1 * kj::NANOSECONDS);
  await(loop, kj::mv(terminated));
  EXPECT_EQ(job.status(), JobPhase::STOPPED);
  EXPECT_EQ(job.reason(), "terminated");
  for (auto pid : pids) EXPECT_TRUE(test::waitGone(pid)) << pid;
  for (auto& r : job.replicas()) EXPECT_EQ(r.pid, 0);
  EXPECT_EQ(launcher.available(), launcher.machine());
  // Terminating again changes nothing.
  await(loop, job.terminate());
  EXPECT_EQ(job.status(), JobPhase::STOPPED);
}

TEST_F(LocalLauncherClockTest, WaitTimesOutWhileTheJobGoesOn) {
  auto& launcher = start();
  auto job = launcher.submit(request("long", replica({"wait"})));
  auto waited = job.wait(50 * kj::MILLISECONDS);
  loop.advanceTime(50 * kj::MILLISECONDS - 1 * kj::NANOSECONDS);
  EXPECT_FALSE(waited.poll(loop.waitScope())) << "gave up before its timeout";
  loop.advanceTime(1 * kj::NANOSECONDS);
  ASSERT_TRUE(waited.poll(loop.waitScope())) << "still waiting at its timeout";
  auto failure = awaitError(loop, kj::mv(waited));
  EXPECT_EQ(failure.code, ErrorCode::DEADLINE_EXCEEDED);
  EXPECT_TRUE(failure.mentions("'long' is still running")) << failure.text;
  EXPECT_EQ(job.status(), JobPhase::RUNNING);
  await(loop, job.terminate(0 * kj::SECONDS));
  EXPECT_EQ(finalPhase(job), JobPhase::STOPPED);
}

TEST_F(LocalLauncherTest, ALiveJobsNameIsRefusedUnlessAdoptedAndFreeOnceItEnds) {
  auto& launcher = start();
  auto job = launcher.submit(request("dup", replica({"wait"})));
  awaitStarted(job);
  auto pid = job.replicas()[0].pid;

  auto refused = thrownBy([&]() { launcher.submit(request("dup", replica({"exit", "0"}))); });
  EXPECT_EQ(refused.code, ErrorCode::JOB_ALREADY_EXISTS);
  EXPECT_TRUE(refused.mentions("'dup' is already running")) << refused.text;

  auto adoptRequest = request("dup", replica({"exit", "0"}));
  adoptRequest.adopt = true;
  auto adopted = launcher.submit(kj::mv(adoptRequest));
  EXPECT_EQ(adopted.replicas()[0].pid, pid);  // the same job, left as it was
  EXPECT_EQ(adopted.status(), JobPhase::RUNNING);

  await(loop, job.terminate());
  EXPECT_EQ(adopted.status(), JobPhase::STOPPED);
  auto again = launcher.submit(request("dup", replica({"exit", "0"})));
  EXPECT_EQ(finalPhase(again), JobPhase::SUCCEEDED) << again.reason();
  KJ_IF_MAYBE(found, launcher.find("dup")) {
    EXPECT_EQ(found->status(), JobPhase::SUCCEEDED);
  } else {
    ADD_FAILURE() << "find() does not know the job";
  }
}

TEST_F(LocalLauncherTest, FunctionEntrypointsRunInThisProgramWithTheirArguments) {
  auto& launcher = start();
  auto job = launcher.submit(
      request("fn", Entrypoint::function("print-args", {"a b", "--gtest_filter=x", ""}), 2));
  ASSERT_EQ(finalPhase(job), JobPhase::SUCCEEDED) << job.reason();
  auto lines = job.logs(100);
  for (std::string p : {"[0] ", "[1] "}) {
    EXPECT_TRUE(contains(lines, p + "ARGS 3"));
    EXPECT_TRUE(contains(lines, p + "[a b]"));
    EXPECT_TRUE(contains(lines, p + "[--gtest_filter=x]"));
    EXPECT_TRUE(contains(lines, p + "[]"));
    EXPECT_TRUE(contains(lines, p + "TROUPE_ENTRYPOINT unset"));
  }
  EXPECT_TRUE(contains(lines, "[1] TASK 1"));

  auto exitWith = launcher.submit(request("exit5", Entrypoint::function("exit-with", {"5"})));
  ASSERT_EQ(finalPhase(exitWith), JobPhase::FAILED);
  EXPECT_NE(exitWith.reason().find("exited with status 5"), std::string::npos);

  auto unknown = launcher.submit(request("unknown", Entrypoint::function("no-such-function")));
  ASSERT_EQ(finalPhase(unknown), JobPhase::FAILED);
  EXPECT_EQ(grep(unknown, "no entrypoint function named 'no-such-function'").size(), 1u);
}

TEST_F(LocalLauncherTest, CreateActorGroupThenWaitReadyThenCallsEndToEnd) {
  auto& launcher = start();
  auto group = createActorGroup<test::Member>(
      launcher, request("members", Entrypoint::function("member"), 3), "member");
  auto ready = await(loop, group->waitReady(3, PATIENCE));
  ASSERT_EQ(ready.size(), 3u);

  ActorPool<test::Member> pool(*group);
  auto names = test::memberNames(loop, pool, PATIENCE);
  EXPECT_EQ(names,
            (std::set<std::string>{"members/member-0", "members/member-1", "members/member-2"}));
  auto one = await(loop, pool.call([](test::Member::Client c) { return c.whoamiRequest().send(); })
                             .then([](auto r) { return std::string(r.getName().cStr()); }));
  EXPECT_EQ(names.count(one), 1u);

  // Terminating the job ends it in the resolver: the group learns, and waiting fails fast.
  auto& job = group.job;
  EXPECT_EQ(job.id(), KJ_ASSERT_NONNULL(launcher.find("members")).id());
  await(loop, job.terminate());
  EXPECT_EQ(job.status(), JobPhase::STOPPED);
  while (group->jobEnded() == nullptr) await(loop, group->whenChanged());
  EXPECT_EQ(group->readyCount(), 0u);
  auto failure = awaitError(loop, group->waitReady(1, PATIENCE));
  EXPECT_EQ(failure.code, ErrorCode::JOB_ENDED) << failure.text;
}

TEST_F(LocalLauncherTest, AKilledReplicaRestartsWithANewIncarnationAndFreshState) {
  auto& launcher = start();
  auto req = request("restart", Entrypoint::function("member"), 2);
  req.maxRetriesFailure = 1;
  auto group = createActorGroup<test::Member>(launcher, kj::mv(req), "member");
  auto& job = group.job;
  await(loop, group->waitReady(2, PATIENCE));

  auto memberZero = [&]() -> kj::Maybe<Endpoint> {
    for (auto& e : group->members()) {
      if (e.taskIndex == 0 && e.state == EndpointState::READY) return e;
    }
    return nullptr;
  };
  auto before = KJ_ASSERT_NONNULL(memberZero());
  auto ref = ActorRef<test::Member>::connect(loop, before.address, "member");
  for (int i = 0; i < 3; ++i) {
    await(loop,
          ref.call([](test::Member::Client c) { return c.whoamiRequest().send(); }).ignoreResult());
  }
  auto calls = await(loop, ref.call([](test::Member::Client c) { return c.callsRequest().send(); })
                               .then([](auto r) { return r.getCount(); }));
  EXPECT_EQ(calls, 3u);

  auto oldPid = job.replicas()[0].pid;
  ASSERT_GT(oldPid, 0);
  ASSERT_EQ(::kill(oldPid, SIGKILL), 0);

  // The replica comes back as a new process, and registers again under a new incarnation.
  kj::Maybe<Endpoint> after;
  for (;;) {
    after = memberZero();
    KJ_IF_MAYBE(e, after) {
      if (e->incarnation != before.incarnation) break;
    }
    await(loop, group->whenChanged());
  }
  auto now = KJ_ASSERT_NONNULL(after);
  EXPECT_EQ(job.status(), JobPhase::RUNNING);
  EXPECT_EQ(job.replicas()[0].starts, 2u);
  EXPECT_NE(job.replicas()[0].pid, oldPid);
  EXPECT_TRUE(test::waitGone(oldPid));
  EXPECT_EQ(job.replicas()[1].starts, 1u);
  EXPECT_EQ(grep(job, "(its previous run was killed by signal 9 (SIGKILL))").size(), 1u);

  auto fresh = ActorRef<test::Member>::connect(loop, now.address, "member");
  auto freshCalls = await(
      loop,
      fresh.call([](test::Member::Client c) { return c.callsRequest().send(); }).then([](auto r) {
        return r.getCount();
      }));
  EXPECT_EQ(freshCalls, 0u);  // a new process: nothing of the old one's state

  // The retry budget is spent: the next failure fails the job.
  ASSERT_EQ(::kill(job.replicas()[1].pid, SIGKILL), 0);
  ASSERT_EQ(finalPhase(job), JobPhase::FAILED);
  EXPECT_NE(job.reason().find("replica 1"), std::string::npos) << job.reason();
  EXPECT_NE(job.reason().find("SIGKILL"), std::string::npos) << job.reason();
}

TEST_F(LocalLauncherTest, DrainStopsEveryJobAndRefusesNewOnes) {
  auto& launcher = start();
  auto running = launcher.submit(request("running", replica({"wait"}), 1, 4));
  auto pending = launcher.submit(request("pending", replica({"exit", "0"}), 1, 1));
  awaitStarted(running);
  auto pid = running.replicas()[0].pid;
  EXPECT_EQ(pending.status(), JobPhase::PENDING);

  // Through the interface every launcher has.
  Launcher& any = launcher;
  await(loop, any.drain());
  EXPECT_EQ(running.status(), JobPhase::STOPPED);
  EXPECT_EQ(running.reason(), "the launcher shut down");
  EXPECT_EQ(pending.status(), JobPhase::STOPPED);
  EXPECT_TRUE(gone(pid));
  auto refused = thrownBy([&]() { launcher.submit(request("late", replica({"exit", "0"}))); });
  EXPECT_TRUE(refused.mentions("shut down")) << refused.text;
}

TEST_F(LocalLauncherTest, DestroyingTheLauncherKillsItsReplicasAndTheHandleStaysUsable) {
  auto& launcher = start();
  auto job = launcher.submit(request("orphan", replica({"wait", "--ignore-term"}), 2));
  awaitStarted(job);
  std::vector<pid_t> pids;
  for (auto& r : job.replicas()) pids.push_back(r.pid);

  this->launcher = nullptr;
  for (auto pid : pids) EXPECT_TRUE(gone(pid)) << pid;
  EXPECT_EQ(job.status(), JobPhase::STOPPED);
  EXPECT_EQ(job.reason(), "the launcher was destroyed");
  await(loop, job.terminate());
  EXPECT_EQ(await(loop, job.wait(PATIENCE)), JobPhase::STOPPED);
  EXPECT_EQ(job.logs(10).size(), 2u);  // each replica's start marker
}

TEST_F(LocalLauncherTest, PromisesKeptPastTheLauncherSettleWithoutIt) {
  auto& launcher = start();
  auto blocker = launcher.submit(request("blocker", replica({"wait"}), 1, 4));
  auto pending = launcher.submit(request("pending", replica({"exit", "0"})));
  ASSERT_EQ(pending.status(), JobPhase::PENDING);
  auto terminated = pending.terminate();  // ends it now; its report to the resolver is queued
  auto shutdown = launcher.drain(0 * kj::SECONDS);
  this->launcher = nullptr;
  await(loop, kj::mv(terminated));
  auto failure = awaitError(loop, kj::mv(shutdown));
  EXPECT_TRUE(failure.mentions("the launcher was destroyed")) << failure.text;
  EXPECT_EQ(pending.status(), JobPhase::STOPPED);
  EXPECT_EQ(blocker.status(), JobPhase::STOPPED);
}

}  // namespace
}  // namespace troupe

namespace troupe {
namespace {

TEST_F(LocalLauncherTest, ReplicasGetTheJobCredentialInAFileOnlyTheirUserCanRead) {
  auto& launcher = start();
  auto job = launcher.submit(request("owned", replica({"env", "TROUPE_JOB_TOKEN_FILE"})));
  ASSERT_EQ(finalPhase(job), JobPhase::SUCCEEDED) << job.reason();
  auto lines = grep(job, "TROUPE_JOB_TOKEN_FILE=");
  ASSERT_EQ(lines.size(), 1u);
  auto path = lines[0].substr(lines[0].find('=') + 1);
  EXPECT_EQ(path, dir.path + "/owned/job-token");
  struct stat st;
  EXPECT_NE(::stat(path.c_str(), &st), 0) << "the file outlived its job";

  // While a job runs, its file is there, its user's alone.
  auto running = launcher.submit(request("running", replica({"wait"})));
  awaitStarted(running);
  auto file = dir.path + "/running/job-token";
  ASSERT_EQ(::stat(file.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  std::ifstream in(file);
  std::string credential((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(credential.size(), 64u);
  EXPECT_TRUE(grep(running, credential).empty());  // in no log line
  EXPECT_EQ(sink->count(credential), 0u);
}

TEST_F(LocalLauncherTest, ASecondLauncherCannotTakeALiveJobsName) {
  auto& first = start();
  auto running = first.submit(request("calc", replica({"wait"})));
  awaitStarted(running);
  // Another launcher on the same registry, as another `troupe launch` would be.
  auto o = options();
  o.resolver = first.resolverUrl();
  test::TempDir otherDir;
  o.logDirectory = otherDir.path;
  LocalLauncher second(loop, kj::mv(o));
  auto refused = second.submit(request("calc", replica({"exit", "0"})));
  ASSERT_EQ(finalPhase(refused), JobPhase::FAILED);
  EXPECT_NE(refused.reason().find("job 'calc' already exists and is live"), std::string::npos)
      << refused.reason();
  for (auto& r : refused.replicas()) EXPECT_EQ(r.starts, 0u);  // nothing ran
  // The first job runs on, and the resolver still has it running.
  EXPECT_EQ(running.status(), JobPhase::RUNNING);
  auto resolver = openResolver(loop, first.resolverUrl());
  EXPECT_EQ(await(loop, resolver->jobStatus("calc")).state, JobState::RUNNING);
}

TEST_F(LocalLauncherClockTest, AJobWaitsForAResolverThatIsDownAndStartsOnceItIsCreated) {
  test::TempSocket socket("late-registry");
  auto o = options();
  o.resolver = "registry+unix:" + socket.path;
  auto& launcher = start(kj::mv(o));
  auto job = launcher.submit(request("late", replica({"wait"})));
  while (job.reason().find("waiting for the resolver: ") == std::string::npos) {
    await(loop, job.whenChanged());
  }
  EXPECT_EQ(job.status(), JobPhase::RUNNING);
  EXPECT_EQ(job.replicas()[0].pid, 0);  // no replica runs without the job's credential

  RegistryServer registry(loop);
  registry.listen(("unix:" + socket.path).c_str());
  loop.advanceTime(5 * kj::SECONDS);  // past the longest wait between attempts
  awaitStarted(job);
  EXPECT_EQ(job.reason(), "");
  auto other = openResolver(loop, ("registry+unix:" + socket.path).c_str());
  EXPECT_EQ(awaitError(loop, other->createJob("late")).code, ErrorCode::JOB_ALREADY_EXISTS);
}

TEST_F(LocalLauncherClockTest, AJobFailsWhenItsResolverStaysDownPastItsPatience) {
  test::TempSocket socket("down-registry");
  auto o = options();
  o.resolver = "registry+unix:" + socket.path;
  o.resolverPatience = 2 * kj::SECONDS;
  auto& launcher = start(kj::mv(o));
  auto job = launcher.submit(request("down", replica({"wait"})));
  while (job.reason().find("waiting for the resolver: ") == std::string::npos) {
    await(loop, job.whenChanged());
  }
  // Each step is past the longest wait between attempts, so an attempt fails in each.
  for (int step = 0; step < 5 && !isFinal(job.status()); ++step) {
    loop.advanceTime(6 * kj::SECONDS);
    await(loop, job.whenChanged());
  }
  EXPECT_EQ(job.status(), JobPhase::FAILED);
  EXPECT_NE(job.reason().find("the resolver could not create the job within 2000 ms: "),
            std::string::npos)
      << job.reason();
  EXPECT_EQ(job.replicas()[0].starts, 0u);  // nothing ran
}

}  // namespace
}  // namespace troupe
