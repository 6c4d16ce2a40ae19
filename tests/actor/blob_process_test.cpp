// Blobs between processes (troupe_test_blob_peer): a member killed in the middle of a broadcast
// of eight, a member whose loop freezes, and a sender killed in the middle of a transfer. The
// members report what they were handed by its XXH3-64, so the test checks every byte.

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include <memory>
#include <random>
#include <thread>

#include <gtest/gtest.h>
#include <kj/debug.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "troupe/actor/blob.h"
#include "troupe/base/errors.h"
#include "tests/support/child_process.h"

namespace troupe {
namespace {

constexpr uint64_t BLOB_BYTES = 16 << 20;

struct Member {
  explicit Member(std::vector<std::string> flags = {}) {
    flags.insert(flags.begin(), "receive");
    process = std::make_unique<test::ChildProcess>(TROUPE_TEST_BLOB_PEER_PATH, flags);
    auto line = process->readLine(30000);
    EXPECT_EQ(line.rfind("LISTENING ", 0), 0u) << line;
    address = line.substr(strlen("LISTENING "));
  }
  // The next line that starts with `prefix`, skipping others.
  std::string waitFor(const std::string& prefix) {
    for (;;) {
      auto line = process->readLine(60000);
      if (line.empty() || line.rfind(prefix, 0) == 0) return line;
    }
  }
  std::unique_ptr<test::ChildProcess> process;
  std::string address;
};

kj::Array<kj::byte> pattern(uint64_t size) {
  auto bytes = kj::heapArray<kj::byte>(size);
  std::mt19937_64 random(size);
  for (auto& b : bytes) b = static_cast<kj::byte>(random());
  return bytes;
}

std::string checksumOf(kj::ArrayPtr<const kj::byte> bytes) {
  char hex[17];
  snprintf(hex, sizeof(hex), "%016llx",
           static_cast<unsigned long long>(XXH3_64bits(bytes.begin(), bytes.size())));
  return hex;
}

// sendBlob on a thread of its own, with its own loop, so that the test can act on the members'
// output while the transfer runs.
class SenderThread {
public:
  SenderThread(std::vector<BlobTarget> targets, kj::ArrayPtr<const kj::byte> bytes,
               BlobSendOptions options, kj::Duration deadline = 120 * kj::SECONDS)
      : thread([this, targets = kj::mv(targets), bytes, options = kj::mv(options),
                deadline]() mutable {
          EventLoop loop;
          setLoopCredentials(loop, Credentials::none());
          kj::Array<const kj::byte> copy = kj::heapArray<kj::byte>(bytes);
          auto transfer = sendBlob(loop, kj::arrayPtr(targets.data(), targets.size()), "weights", 1,
                                   kj::mv(copy), kj::mv(options));
          for (auto& r : transfer.waitAll(deadline).wait(loop.waitScope())) {
            results.push_back(kj::mv(r));
          }
        }) {}

  std::vector<BlobResult> join() {
    thread.join();
    return kj::mv(results);
  }

private:
  std::vector<BlobResult> results;
  std::thread thread;
};

std::vector<BlobTarget> targetsOf(std::vector<std::unique_ptr<Member>>& members) {
  std::vector<BlobTarget> targets;
  for (size_t i = 0; i < members.size(); ++i) {
    targets.push_back({"blobs/m-" + std::to_string(i), members[i]->address});
  }
  return targets;
}

std::string errorOf(const BlobResult& r) {
  KJ_IF_MAYBE(e, r.error) {
    return e->getDescription().cStr();
  }
  return "ok";
}

TEST(BlobProcessTest, AMemberKilledInTheMiddleOfABroadcastOfEightIsRoutedAround) {
  std::vector<std::unique_ptr<Member>> members;
  for (int i = 0; i < 8; ++i) {
    std::vector<std::string> flags;
    if (i == 2) flags = {"--pause-at", std::to_string(1 << 20)};
    members.push_back(std::make_unique<Member>(flags));
  }
  auto bytes = pattern(BLOB_BYTES);
  SenderThread sender(targetsOf(members), bytes,
                      {.fanout = Fanout::CHAIN, .chunkBytes = 256 << 10, .windowBytes = 1 << 20});
  auto& victim = *members[2];
  ASSERT_EQ(victim.waitFor("PAUSED").rfind("PAUSED ", 0), 0u);
  victim.process->kill(SIGKILL);
  victim.process->wait();
  auto results = sender.join();
  ASSERT_EQ(results.size(), 8u);
  auto expected = "RECEIVED 1 " + std::to_string(BLOB_BYTES) + " " + checksumOf(bytes);
  for (size_t i = 0; i < 8; ++i) {
    SCOPED_TRACE(results[i].endpoint);
    if (i == 2) {
      EXPECT_FALSE(results[i].ok());
      EXPECT_NE(errorOf(results[i]).find("blobs/m-2"), std::string::npos) << errorOf(results[i]);
      EXPECT_GE(results[i].bytes, 0u);
      EXPECT_LT(results[i].bytes, BLOB_BYTES);
      continue;
    }
    EXPECT_TRUE(results[i].ok()) << errorOf(results[i]);
    EXPECT_EQ(results[i].bytes, BLOB_BYTES);
    EXPECT_EQ(members[i]->waitFor("RECEIVED"), expected);
  }
}

TEST(BlobProcessTest, AMemberWhoseLoopFreezesIsGivenUpAfterTheStallTimeout) {
  std::vector<std::unique_ptr<Member>> members;
  for (int i = 0; i < 4; ++i) {
    std::vector<std::string> flags;
    if (i == 1) flags = {"--pause-at", std::to_string(1 << 20)};
    members.push_back(std::make_unique<Member>(flags));
  }
  auto bytes = pattern(BLOB_BYTES);
  SenderThread sender(targetsOf(members), bytes,
                      {.fanout = Fanout::CHAIN,
                       .chunkBytes = 256 << 10,
                       .windowBytes = 1 << 20,
                       .stallTimeout = 1 * kj::SECONDS});
  auto results = sender.join();  // the frozen member never answers its ping
  ASSERT_EQ(results.size(), 4u);
  auto& frozen = KJ_ASSERT_NONNULL(results[1].error);
  EXPECT_EQ(errorCode(frozen), ErrorCode::DEADLINE_EXCEEDED) << frozen.getDescription().cStr();
  EXPECT_NE(errorOf(results[1]).find("no progress in 1000 ms"), std::string::npos)
      << errorOf(results[1]);
  auto expected = "RECEIVED 1 " + std::to_string(BLOB_BYTES) + " " + checksumOf(bytes);
  for (size_t i : {0, 2, 3}) {
    EXPECT_TRUE(results[i].ok()) << errorOf(results[i]);
    EXPECT_EQ(members[i]->waitFor("RECEIVED"), expected);
  }
}

TEST(BlobProcessTest, TheDeadlineGivesTheTransferUpEverywhereItRuns) {
  // Member 1 stalls (its loop stops) but stays within the stall timeout: the deadline ends it.
  std::vector<std::unique_ptr<Member>> members;
  members.push_back(std::make_unique<Member>());
  members.push_back(
      std::make_unique<Member>(std::vector<std::string>{"--pause-at", std::to_string(1 << 20)}));
  members.push_back(std::make_unique<Member>());
  auto bytes = pattern(BLOB_BYTES);
  SenderThread sender(targetsOf(members), bytes,
                      {.fanout = Fanout::CHAIN,
                       .chunkBytes = 256 << 10,
                       .windowBytes = 1 << 20,
                       .stallTimeout = 60 * kj::SECONDS},
                      500 * kj::MILLISECONDS);
  auto results = sender.join();
  ASSERT_EQ(results.size(), 3u);
  for (auto& r : results) {
    SCOPED_TRACE(r.endpoint);
    auto& e = KJ_ASSERT_NONNULL(r.error);
    EXPECT_EQ(errorCode(e), ErrorCode::DEADLINE_EXCEEDED) << e.getDescription().cStr();
  }
  // The stalled member, once it runs again, finds the transfer given up by the member before
  // it, and frees what it held.
  auto& stalled = *members[1];
  stalled.process->kill(SIGUSR1);
  auto gaveUp = stalled.waitFor("GAVE_UP");
  EXPECT_NE(gaveUp.find("aborted by its sender"), std::string::npos) << gaveUp;
  EXPECT_EQ(stalled.waitFor("FREED"), "FREED " + std::to_string(BLOB_BYTES));
}

// Why a member cannot read a sibling process's memory here, or "" where it can: Yama's
// ptrace_scope above 0 lets a process read only its descendants.
std::string whyNoSiblingReads() {
  int scope = 0;
  if (FILE* f = fopen("/proc/sys/kernel/yama/ptrace_scope", "r")) {
    if (fscanf(f, "%d", &scope) != 1) scope = 0;
    fclose(f);
  }
  return scope > 0 ? "kernel.yama.ptrace_scope is " + std::to_string(scope) +
                         ": members fall back to shared memory, as the fallback test checks"
                   : "";
}

// How the chunks of a transfer came.
enum class Path { CONNECTION, SHARED_MEMORY, READS };

// A sender killed with part of the blob sent: the member never hands the part over, gives the
// transfer up and frees its memory. `listen`: where the member listens; `path`: how the chunks
// must have come (the sender's --reads).
void senderKilledMidTransfer(const std::string& listen, Path path) {
  Member member({"--pause-at", std::to_string(1 << 20), "--idle-ms", "300", "--listen", listen});
  test::ChildProcess sender(TROUPE_TEST_BLOB_PEER_PATH,
                            {"send", "--to", "blobs/m-0=" + member.address, "--size",
                             std::to_string(BLOB_BYTES), "--reads",
                             path == Path::SHARED_MEMORY ? "no" : "yes"});
  ASSERT_EQ(sender.readLine(30000), "SENDING");
  ASSERT_EQ(member.waitFor("PAUSED").rfind("PAUSED ", 0), 0u);
  sender.kill(SIGKILL);
  sender.wait();
  member.process->kill(SIGUSR1);
  EXPECT_EQ(member.waitFor("RESUMED"), "RESUMED");
  // Nothing is handed over before the transfer is given up.
  std::string line;
  do {
    line = member.process->readLine(60000);
    EXPECT_EQ(line.rfind("RECEIVED", 0), std::string::npos) << "a partial blob was handed over";
  } while (!line.empty() && line.rfind("GAVE_UP", 0) != 0);
  EXPECT_NE(line.find("no chunk for 300 ms"), std::string::npos) << line;
  auto shared = member.waitFor("SHARED");
  EXPECT_EQ(shared == "SHARED 0", path != Path::SHARED_MEMORY) << shared;
  // Read from the sender's memory: the chunks up to the pause, and none once it was gone.
  auto read = member.waitFor("READ");
  if (path == Path::READS) {
    EXPECT_EQ(read, "READ " + std::to_string(1 << 20));
  } else {
    EXPECT_EQ(read, "READ 0");
  }
  EXPECT_EQ(member.waitFor("FREED"), "FREED " + std::to_string(BLOB_BYTES));
}

// A directory for a member's same-host socket, removed with it.
struct SocketDir {
  SocketDir() {
    char pattern[] = "/tmp/troupe-blob-test-XXXXXX";
    dir = mkdtemp(pattern);
  }
  ~SocketDir() {
    ::unlink(socket().c_str());
    ::rmdir(dir.c_str());
  }
  std::string socket() const { return dir + "/member.sock"; }
  std::string dir;
};

TEST(BlobProcessTest, ASenderKilledMidTransferLeavesTheReceiverHoldingNothing) {
  senderKilledMidTransfer("tcp://127.0.0.1:0", Path::CONNECTION);
}

// The same on one host: the member read the chunks out of the sender's memory (README, "Same
// host"), and once the sender was gone it read nothing more.
TEST(BlobProcessTest, ASenderOnTheSameHostKilledMidTransferLeavesTheReceiverHoldingNothing) {
  auto why = whyNoSiblingReads();
  if (!why.empty()) GTEST_SKIP() << why;
  SocketDir dir;
  senderKilledMidTransfer("unix:" + dir.socket(), Path::READS);
}

// The same with the sender's memory not to be read: the chunks came through shared memory.
TEST(BlobProcessTest, ASenderOnTheSameHostKilledMidTransferThroughSharedMemory) {
  SocketDir dir;
  senderKilledMidTransfer("unix:" + dir.socket(), Path::SHARED_MEMORY);
}

// A member on this host reads the blob out of the sender's memory, or, where the kernel refuses
// (a seccomp filter denies it, as container runtimes' may), takes it through the connection's
// shared memory: every byte arrives either way.
TEST(BlobProcessTest, AMemberOnTheSameHostReadsTheSendersMemoryOrFallsBackToSharedMemory) {
  auto expected = checksumOf(pattern(BLOB_BYTES));
  bool canRead = whyNoSiblingReads().empty();
  for (bool denied : {false, true}) {
    SCOPED_TRACE(denied ? "reads denied" : "reads allowed");
    SocketDir dir;
    std::vector<std::string> flags = {"--listen", "unix:" + dir.socket()};
    if (denied) flags.push_back("--deny-reads");
    Member member(flags);
    test::ChildProcess sender(TROUPE_TEST_BLOB_PEER_PATH,
                              {"send", "--to", "blobs/m-0=" + member.address, "--size",
                               std::to_string(BLOB_BYTES)});
    EXPECT_EQ(sender.readLine(30000), "SENDING");
    EXPECT_EQ(sender.readLine(60000), "RESULT blobs/m-0 ok");
    EXPECT_EQ(member.waitFor("RECEIVED"),
              "RECEIVED 1 " + std::to_string(BLOB_BYTES) + " " + expected);
    auto shared = member.waitFor("SHARED");
    auto read = member.waitFor("READ");
    if (denied || !canRead) {
      EXPECT_EQ(read, "READ 0");
      EXPECT_NE(shared, "SHARED 0");
    } else {
      EXPECT_EQ(read, "READ " + std::to_string(BLOB_BYTES));
      EXPECT_EQ(shared, "SHARED 0");
    }
    sender.wait();
  }
}

}  // namespace
}  // namespace troupe
