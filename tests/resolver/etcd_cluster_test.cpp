// EtcdCluster, the harness the etcd-backed tests run on, against real etcd: members start and
// answer, writes reach every member, a member killed or frozen leaves the others serving and
// catches up when it is back, compaction refuses old revisions, and nothing is left behind.

#include "tests/support/etcd_cluster.h"

#include <signal.h>
#include <sys/stat.h>

#include <filesystem>

#include <gtest/gtest.h>

namespace troupe::test {
namespace {

bool exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

// Whether a process `pid` is there at all (a zombie counts); a reaped child is not.
bool processExists(pid_t pid) { return ::kill(pid, 0) == 0 || errno != ESRCH; }

TEST(EtcdClusterTest, OneMemberStartsAndAnswersOnItsSocket) {
  EtcdCluster cluster;
  ASSERT_EQ(cluster.size(), 1u);
  EXPECT_TRUE(cluster.running(0));
  EXPECT_GT(cluster.pid(0), 0);
  EXPECT_EQ(cluster.directory().rfind("/tmp/troupe-etcd-", 0), 0u) << cluster.directory();
  EXPECT_EQ(cluster.socketPath(0), cluster.directory() + "/c1:1");
  EXPECT_TRUE(exists(cluster.socketPath(0)));

  auto status = cluster.post(0, "/v3/maintenance/status", "{}");
  EXPECT_EQ(status.status, 200) << status.body;
  EXPECT_TRUE(jsonString(status.body, "version").has_value()) << status.body;
  EXPECT_TRUE(jsonString(status.body, "leader").has_value()) << status.body;

  EXPECT_EQ(cluster.url(), "etcd+unix:" + cluster.socketPath(0) + "?root=troupe");
  EXPECT_EQ(cluster.url("t7", 1500), "etcd+unix:" + cluster.socketPath(0) + "?root=t7&ttl_ms=1500");

  // etcd's own refusal comes back as a reply, not as an exception.
  auto refused = cluster.post(0, "/v3/kv/range", "{\"key\":\"AA==\",\"revision\":\"99\"}");
  EXPECT_EQ(refused.status, 400) << refused.body;
  EXPECT_NE(refused.body.find("future revision"), std::string::npos) << refused.body;
}

TEST(EtcdClusterTest, APutIsReadBackAndMovesTheRevision) {
  EtcdCluster cluster;
  auto before = cluster.revision();
  auto written = cluster.put("troupe/greeting", "hello");
  EXPECT_EQ(written, before + 1);
  EXPECT_EQ(cluster.revision(), written);
  EXPECT_EQ(cluster.get("troupe/greeting"), "hello");
  EXPECT_EQ(cluster.get("troupe/absent"), std::nullopt);
  cluster.put("troupe/empty", "");
  EXPECT_EQ(cluster.get("troupe/empty"), "");

  // The same through the gateway by hand: keys and values in base64.
  auto range = cluster.post(0, "/v3/kv/range", "{\"key\":\"" + base64("troupe/greeting") + "\"}");
  ASSERT_EQ(range.status, 200) << range.body;
  EXPECT_EQ(jsonString(range.body, "value"), base64("hello")) << range.body;
  EXPECT_EQ(jsonString(range.body, "mod_revision"), std::to_string(written)) << range.body;

  // A lease, granted and revoked, takes its key with it.
  auto grant = cluster.post(0, "/v3/lease/grant", "{\"TTL\":30}");
  ASSERT_EQ(grant.status, 200) << grant.body;
  auto lease = jsonString(grant.body, "ID");
  ASSERT_TRUE(lease.has_value()) << grant.body;
  auto put = cluster.post(0, "/v3/kv/put",
                          "{\"key\":\"" + base64("troupe/leased") + "\",\"value\":\"" +
                              base64("x") + "\",\"lease\":\"" + *lease + "\"}");
  ASSERT_EQ(put.status, 200) << put.body;
  EXPECT_EQ(cluster.get("troupe/leased"), "x");
  auto revoke = cluster.post(0, "/v3/lease/revoke", "{\"ID\":\"" + *lease + "\"}");
  ASSERT_EQ(revoke.status, 200) << revoke.body;
  EXPECT_EQ(cluster.get("troupe/leased"), std::nullopt);
}

TEST(EtcdClusterTest, ThreeMembersStartAndAWriteOnOneIsReadOnAnother) {
  EtcdCluster cluster(3);
  ASSERT_EQ(cluster.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_TRUE(exists(cluster.socketPath(i))) << i;
    EXPECT_EQ(cluster.socketPath(i), cluster.directory() + "/c" + std::to_string(i + 1) + ":1");
  }
  EXPECT_EQ(cluster.url("r"), "etcd+unix:" + cluster.socketPath(0) + "," + cluster.socketPath(1) +
                                  "," + cluster.socketPath(2) + "?root=r");
  EXPECT_LT(cluster.waitForLeader(), 3u);
  cluster.put("k", "from member 0", 0);
  EXPECT_EQ(cluster.get("k", 2), "from member 0");
  EXPECT_EQ(cluster.get("k", 1), "from member 0");
  EXPECT_THROW(cluster.restartEmpty(), std::logic_error);  // for one member only
  EXPECT_EQ(cluster.get("k", 2), "from member 0");
}

TEST(EtcdClusterTest, KillingAMemberLeavesTheOthersServingAndARestartCatchesUp) {
  EtcdCluster cluster(3);
  cluster.waitForLeader();
  auto pid = cluster.pid(0);
  cluster.kill(0);
  EXPECT_FALSE(cluster.running(0));
  EXPECT_EQ(cluster.pid(0), -1);
  EXPECT_FALSE(processExists(pid));  // killed and reaped
  EXPECT_THROW(cluster.post(0, "/v3/maintenance/status", "{}"), std::runtime_error);

  // Whether or not it led, 1 and 2 agree on a leader among them and take writes.
  auto leader = cluster.waitForLeader();
  EXPECT_NE(leader, 0u);
  cluster.put("k", "while 0 was down", 1);
  EXPECT_EQ(cluster.get("k", 2), "while 0 was down");

  // Back with its data, it catches up on what it missed.
  cluster.restart(0);
  EXPECT_TRUE(cluster.running(0));
  EXPECT_NE(cluster.pid(0), pid);
  EXPECT_EQ(cluster.get("k", 0), "while 0 was down");
}

TEST(EtcdClusterTest, AFrozenLeaderIsReplacedAndFollowsTheNewOneWhenThawed) {
  EtcdCluster cluster(3);
  auto old = cluster.waitForLeader();
  cluster.freeze(old);
  EXPECT_TRUE(cluster.frozen(old));
  EXPECT_TRUE(cluster.running(old));
  auto leader = cluster.waitForLeader();
  EXPECT_NE(leader, old);
  auto other = 3 - old - leader;  // the third member
  cluster.put("k", "while frozen", other);
  EXPECT_EQ(cluster.get("k", leader), "while frozen");

  cluster.thaw(old);
  EXPECT_FALSE(cluster.frozen(old));
  EXPECT_EQ(cluster.waitForLeader(), leader);  // the old leader stepped down and follows
  EXPECT_EQ(cluster.get("k", old), "while frozen");
}

TEST(EtcdClusterTest, AWatchFromACompactedRevisionIsCancelled) {
  EtcdCluster cluster;
  auto first = cluster.put("k", "1");
  cluster.put("k", "2");
  auto third = cluster.put("k", "3");
  cluster.compact(third);
  auto watchFrom = [&](int64_t revision, const char* until) {
    return cluster.postUntil(0, "/v3/watch",
                             "{\"create_request\":{\"key\":\"" + base64("k") +
                                 "\",\"start_revision\":\"" + std::to_string(revision) + "\"}}",
                             [&](const std::string& body) {
                               return body.find(until) != std::string::npos;
                             });
  };
  auto cancelled = watchFrom(first, "\"canceled\":true");
  EXPECT_EQ(cancelled.status, 200);
  EXPECT_EQ(jsonString(cancelled.body, "compact_revision"), std::to_string(third))
      << cancelled.body;

  // From the compacted revision on, history is still there.
  auto events = watchFrom(third, "\"events\":");
  EXPECT_EQ(events.body.find("\"canceled\""), std::string::npos) << events.body;
  EXPECT_EQ(jsonString(events.body, "value"), base64("3")) << events.body;

  EXPECT_THROW(cluster.compact(first), std::runtime_error);  // compacted already
  auto read = cluster.post(0, "/v3/kv/range",
                           "{\"key\":\"" + base64("k") + "\",\"revision\":\"" +
                               std::to_string(first) + "\"}");
  EXPECT_EQ(read.status, 400);
  EXPECT_NE(read.body.find("compacted"), std::string::npos) << read.body;
}

TEST(EtcdClusterTest, RestartingAMemberKeepsItsDataAndRestartingEmptyLosesIt) {
  EtcdCluster cluster;
  auto written = cluster.put("k", "kept");
  auto grant = cluster.post(0, "/v3/lease/grant", "{\"TTL\":300}");
  auto lease = jsonString(grant.body, "ID");
  ASSERT_TRUE(lease.has_value()) << grant.body;

  cluster.restart(0);
  EXPECT_EQ(cluster.get("k"), "kept");
  EXPECT_GE(cluster.revision(), written);

  cluster.restartEmpty();
  EXPECT_EQ(cluster.get("k"), std::nullopt);
  EXPECT_EQ(cluster.revision(), 1);
  auto ttl = cluster.post(0, "/v3/lease/timetolive", "{\"ID\":\"" + *lease + "\"}");
  EXPECT_EQ(jsonString(ttl.body, "TTL"), "-1") << ttl.body;  // no such lease
}

TEST(EtcdClusterTest, GoingAwayStopsEveryMemberAndRemovesItsDirectory) {
  std::vector<pid_t> pids;
  std::string dir;
  {
    EtcdCluster cluster(3);
    dir = cluster.directory();
    cluster.freeze(1);  // a frozen member is stopped too
    for (size_t i = 0; i < 3; ++i) pids.push_back(cluster.pid(i));
    EXPECT_TRUE(std::filesystem::exists(dir + "/data1"));
  }
  for (auto pid : pids) EXPECT_FALSE(processExists(pid)) << pid;
  EXPECT_FALSE(std::filesystem::exists(dir)) << dir;
}

}  // namespace
}  // namespace troupe::test
