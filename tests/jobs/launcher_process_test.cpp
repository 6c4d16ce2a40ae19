// A program embedding a LocalLauncher (tests/support/test_launcher_main.cpp) leaves no replica
// behind when it is signalled: SIGTERM shuts its jobs down; a SIGKILL takes FUNCTION replicas
// with it.

#include <signal.h>
#include <sys/wait.h>

#include <fstream>
#include <sstream>

#include <gtest/gtest.h>

#include "tests/support/child_process.h"
#include "tests/support/launcher_helpers.h"

namespace troupe {
namespace {

// The replica pids from the launcher's "PIDS <pid> <pid>" line.
std::vector<pid_t> readPids(test::ChildProcess& launcher) {
  auto line = launcher.readLine(20000);
  std::istringstream in(line);
  std::string word;
  in >> word;
  EXPECT_EQ(word, "PIDS") << "the launcher printed '" << line << "'";
  std::vector<pid_t> pids;
  for (pid_t pid; in >> pid;) pids.push_back(pid);
  EXPECT_EQ(pids.size(), 2u) << line;
  return pids;
}

class LauncherProcessTest : public ::testing::TestWithParam<const char*> {
protected:
  std::vector<std::string> args() {
    std::string mode = GetParam();
    if (mode == "binary") return {"binary", dir.path, TROUPE_TEST_REPLICA_PATH};
    return {"function", dir.path};
  }
  test::TempDir dir;
};

TEST_P(LauncherProcessTest, SigtermStopsTheJobsAndLeavesNoReplica) {
  test::ChildProcess launcher(TROUPE_TEST_LAUNCHER_PATH, args());
  auto pids = readPids(launcher);
  for (auto pid : pids) ASSERT_TRUE(::kill(pid, 0) == 0) << pid;

  launcher.kill(SIGTERM);
  EXPECT_EQ(launcher.readLine(20000), "SHUTDOWN stopped");
  int status = launcher.wait(20000);
  ASSERT_TRUE(WIFEXITED(status)) << status;
  EXPECT_EQ(WEXITSTATUS(status), 0);
  for (auto pid : pids) EXPECT_TRUE(test::waitGone(pid, 0)) << pid;
}

TEST_P(LauncherProcessTest, ByDefaultTheLauncherStopsItsJobsThenDiesOfTheSignal) {
  test::ChildProcess launcher(TROUPE_TEST_LAUNCHER_PATH, args(), {"TROUPE_TEST_DEFAULT_SIGNALS=1"});
  auto pids = readPids(launcher);
  for (auto pid : pids) ASSERT_TRUE(::kill(pid, 0) == 0) << pid;

  launcher.kill(SIGTERM);
  int status = launcher.wait(20000);
  ASSERT_TRUE(WIFSIGNALED(status)) << status;
  EXPECT_EQ(WTERMSIG(status), SIGTERM);
  for (auto pid : pids) EXPECT_TRUE(test::waitGone(pid, 0)) << pid;
  // The replicas were stopped, not orphaned: each got SIGTERM from the launcher.
  std::ifstream log(dir.path + "/held/replica-0.log");
  std::string text((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("--- troupe: job held, replica 0, start 1"), std::string::npos) << text;
}

INSTANTIATE_TEST_SUITE_P(Entrypoints, LauncherProcessTest, ::testing::Values("binary", "function"));

TEST(LauncherProcessKillTest, FunctionReplicasDieWithALauncherKilledOutright) {
  test::TempDir dir;
  test::ChildProcess launcher(TROUPE_TEST_LAUNCHER_PATH, {"function", dir.path});
  auto pids = readPids(launcher);
  ASSERT_EQ(pids.size(), 2u);
  launcher.kill(SIGKILL);
  launcher.wait(20000);
  for (auto pid : pids) EXPECT_TRUE(test::waitGone(pid)) << pid;
}

}  // namespace
}  // namespace troupe
