// Same host: over a unix socket between processes of one user, large messages go through shared
// memory (net/detail/shared_memory.h) and come back whole; a channel can turn that off; when no
// region can be made they go through the socket; and whichever side is killed mid-transfer, the
// other is left holding no region.

#include <signal.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <unistd.h>

#include <fstream>
#include <string>

#include <gtest/gtest.h>

#include "troupe/actor/actor_ref.h"
#include "troupe/actor/actor_server.h"
#include "troupe/base/errors.h"
#include "troupe/net/bytes.h"
#include "tests/support/child_process.h"
#include "tests/support/registry_helpers.h"
#include "tests/support/test_actors.h"
#include "tests/support/test_server.h"

namespace troupe {
namespace {

using test::Echo;

constexpr size_t LARGE = 1 << 20;

// Mappings of shared-memory regions this process holds now, its own and its peers'.
size_t regionsMapped() {
  std::ifstream maps("/proc/self/maps");
  size_t n = 0;
  for (std::string line; std::getline(maps, line);) {
    if (line.find("memfd:troupe-message") != std::string::npos) ++n;
  }
  return n;
}

// Runs the loop until `done()` holds, or fails the test after 10 s of the loop's time.
template <typename F>
void runUntil(EventLoop& loop, F done) {
  auto limit = loop.timer().now() + 10 * kj::SECONDS;
  while (!done()) {
    ASSERT_LT(loop.timer().now(), limit) << "the condition did not come true";
    loop.timer().afterDelay(10 * kj::MILLISECONDS).wait(loop.waitScope());
  }
}

kj::Promise<capnp::Response<Echo::EchoResults>> echo(ActorRef<Echo>& ref, size_t bytes,
                                                     uint8_t seed) {
  return ref.call([bytes, seed](Echo::Client c) {
    auto q = c.echoRequest();
    auto payload = q.initPayload(bytes);
    for (size_t i = 0; i < bytes; ++i) payload[i] = static_cast<kj::byte>(i * 7 + seed);
    return q.send();
  });
}

bool intact(capnp::Data::Reader payload, size_t bytes, uint8_t seed) {
  if (payload.size() != bytes) return false;
  for (size_t i = 0; i < bytes; ++i) {
    if (payload[i] != static_cast<kj::byte>(i * 7 + seed)) return false;
  }
  return true;
}

class SharedMemoryTest : public ::testing::Test {
protected:
  SharedMemoryTest() {
    char pattern[] = "/tmp/troupe-shm-test-XXXXXX";
    dir = mkdtemp(pattern);
    path = dir + "/server.sock";
    server = kj::heap<ActorServer>(loop, JobContext{});
    server->host<Echo>("echo", kj::heap<test::EchoImpl>());
    server->listen(kj::str("unix:", path));
  }
  ~SharedMemoryTest() noexcept override {
    server = nullptr;
    ::unlink(path.c_str());
    ::rmdir(dir.c_str());
  }

  double serverCounter(kj::StringPtr name) { return server->metrics().sum(name); }

  EventLoop loop;
  std::string dir;
  std::string path;
  kj::Own<ActorServer> server;
};

TEST_F(SharedMemoryTest, ALargeCallToAServerOfThisUserGoesThroughSharedMemoryBothWays) {
  auto ref = ActorRef<Echo>::connect(loop, kj::str("unix:", path), "echo");
  for (uint8_t seed = 0; seed < 16; ++seed) {
    auto reply = echo(ref, LARGE, seed).wait(loop.waitScope());
    ASSERT_TRUE(intact(reply.getPayload(), LARGE, seed)) << "call " << int(seed);
  }
  auto& sent = ref.channel().transport();
  EXPECT_EQ(sent.sharedMessagesSent, 16u);
  EXPECT_EQ(sent.sharedMessagesReceived, 16u);
  EXPECT_EQ(serverCounter("troupe_shared_messages_received_total"), 16);
  EXPECT_EQ(serverCounter("troupe_shared_messages_sent_total"), 16);
  // Small calls stay on the socket.
  auto small = echo(ref, 100, 1).wait(loop.waitScope());
  EXPECT_TRUE(intact(small.getPayload(), 100, 1));
  EXPECT_EQ(sent.sharedMessagesSent, 16u);
  // One call at a time: each side reuses one region, mapped here and by the peer.
  EXPECT_LE(regionsMapped(), 4u);
}

TEST_F(SharedMemoryTest, ManyLargeCallsInFlightAllComeBackWhole) {
  auto ref = ActorRef<Echo>::connect(loop, kj::str("unix:", path), "echo");
  kj::Vector<kj::Promise<bool>> calls;
  for (uint8_t seed = 0; seed < 32; ++seed) {
    size_t bytes = LARGE + seed * 4096;
    calls.add(echo(ref, bytes, seed).then([bytes, seed](auto&& reply) {
      return intact(reply.getPayload(), bytes, seed);
    }));
  }
  auto results = kj::joinPromises(calls.releaseAsArray()).wait(loop.waitScope());
  for (size_t i = 0; i < results.size(); ++i) EXPECT_TRUE(results[i]) << "call " << i;
  EXPECT_EQ(ref.channel().transport().sharedMessagesSent, 32u);
}

TEST_F(SharedMemoryTest, BytesKeptFromAMessageInSharedMemoryOutliveItAndAreNeverOverwritten) {
  auto ref = ActorRef<Echo>::connect(loop, kj::str("unix:", path), "echo");
  kj::Vector<kj::Array<kj::byte>> kept;
  for (uint8_t seed = 0; seed < 4; ++seed) {
    auto reply = echo(ref, LARGE, seed).wait(loop.waitScope());
    auto bytes = keepReceivedBytes(reply.getPayload());
    ASSERT_TRUE(bytes != nullptr) << "a large reply in shared memory is kept without a copy";
    kept.add(kj::mv(KJ_ASSERT_NONNULL(bytes)));
  }
  // The server's next replies go to regions of their own, never where the kept bytes are.
  for (uint8_t seed = 100; seed < 108; ++seed) {
    ASSERT_TRUE(intact(echo(ref, LARGE, seed).wait(loop.waitScope()).getPayload(), LARGE, seed));
  }
  EXPECT_EQ(ref.channel().transport().sharedMessagesReceived, 12u);
  for (uint8_t seed = 0; seed < 4; ++seed) {
    EXPECT_TRUE(intact(kept[seed].asPtr(), LARGE, seed)) << "kept reply " << int(seed);
  }
  // They are this process's own to write.
  kept[0][0] = 42;
  EXPECT_EQ(kept[0][0], 42);
  size_t mapped = regionsMapped();
  kept.clear();
  EXPECT_LT(regionsMapped(), mapped);
}

TEST_F(SharedMemoryTest, BytesWrittenThroughAKeptPayloadNeverShowInTheNextMessage) {
  auto ref = ActorRef<Echo>::connect(loop, kj::str("unix:", path), "echo");
  for (uint8_t seed = 0; seed < 8; ++seed) {
    auto reply = echo(ref, LARGE, seed).wait(loop.waitScope());
    ASSERT_TRUE(intact(reply.getPayload(), LARGE, seed)) << "call " << int(seed);
    // Kept, written, and let go of before the message is: the pages written are this process's
    // own from then on, so the region must never carry another message here.
    auto kept = KJ_ASSERT_NONNULL(keepReceivedBytes(reply.getPayload()));
    memset(kept.begin(), 0xee, kept.size());
  }
}

TEST_F(SharedMemoryTest, AChannelWithSharedMemoryOffKeepsEveryByteOnTheSocket) {
  ActorRefOptions options;
  options.channel.sharedMemory = false;
  auto ref = ActorRef<Echo>::connect(loop, kj::str("unix:", path), "echo", options);
  auto reply = echo(ref, LARGE, 3).wait(loop.waitScope());
  EXPECT_TRUE(intact(reply.getPayload(), LARGE, 3));
  EXPECT_EQ(ref.channel().transport().largeMessagesSent, 1u);
  EXPECT_EQ(ref.channel().transport().sharedMessagesSent, 0u);
  EXPECT_EQ(serverCounter("troupe_shared_messages_sent_total"), 0);
}

TEST_F(SharedMemoryTest, WhenNoRegionCanBeMadeLargeCallsGoThroughTheSocket) {
  // A file size limit below a region's size makes every memfd too large to size.
  struct rlimit before;
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &before), 0);
  auto oldHandler = signal(SIGXFSZ, SIG_IGN);
  struct rlimit small = before;
  small.rlim_cur = 16 * 1024;
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &small), 0);
  auto ref = ActorRef<Echo>::connect(loop, kj::str("unix:", path), "echo");
  auto reply = echo(ref, LARGE, 5).wait(loop.waitScope());
  auto second = echo(ref, LARGE, 6).wait(loop.waitScope());
  setrlimit(RLIMIT_FSIZE, &before);
  signal(SIGXFSZ, oldHandler);
  EXPECT_TRUE(intact(reply.getPayload(), LARGE, 5));
  EXPECT_TRUE(intact(second.getPayload(), LARGE, 6));
  EXPECT_EQ(ref.channel().transport().largeMessagesSent, 2u);
  EXPECT_EQ(ref.channel().transport().sharedMessagesSent, 0u);
  EXPECT_EQ(serverCounter("troupe_shared_messages_sent_total"), 0);
  EXPECT_EQ(regionsMapped(), 0u);
}

TEST_F(SharedMemoryTest, ACallerKilledMidTransferLeavesTheServerHoldingNoRegion) {
  ASSERT_EQ(regionsMapped(), 0u);
  {
    test::ChildProcess caller(TROUPE_TEST_CALLER_PATH,
                              {"unix:" + path, "flood", std::to_string(8 << 20)});
    // The caller runs on its own; this loop serves it while waiting for its line.
    auto flooding = loop.offload([&caller]() { return caller.readLine(); });
    ASSERT_EQ(flooding.wait(loop.waitScope()), "FLOODING");
    runUntil(loop, [&]() { return serverCounter("troupe_shared_messages_received_total") >= 8; });
    EXPECT_GT(regionsMapped(), 0u);
    caller.kill(SIGKILL);
    caller.wait();
  }
  runUntil(loop, [&]() { return serverCounter("troupe_connections_open") == 0; });
  runUntil(loop, [&]() { return regionsMapped() == 0; });
  // And it keeps serving.
  auto ref = ActorRef<Echo>::connect(loop, kj::str("unix:", path), "echo");
  EXPECT_TRUE(intact(echo(ref, LARGE, 9).wait(loop.waitScope()).getPayload(), LARGE, 9));
}

TEST(SharedMemoryProcessTest, AServerKilledMidTransferLeavesTheCallerHoldingNoRegion) {
  char pattern[] = "/tmp/troupe-shm-test-XXXXXX";
  std::string dir = mkdtemp(pattern);
  std::string path = dir + "/server.sock";
  EventLoop loop;
  {
    test::TestServer server({"--listen", "unix:" + path});
    auto ref = ActorRef<Echo>::connect(loop, kj::str("unix:", path), "echo");
    ASSERT_TRUE(intact(echo(ref, LARGE, 1).wait(loop.waitScope()).getPayload(), LARGE, 1));
    EXPECT_GT(regionsMapped(), 0u);
    // Calls of 8 MiB on their way, and the server killed under them: each fails, or comes back
    // whole if the server answered it before it died.
    kj::Vector<kj::Promise<bool>> calls;
    for (uint8_t i = 0; i < 4; ++i) {
      calls.add(echo(ref, 8 << 20, i)
                    .then([i](auto&& reply) { return intact(reply.getPayload(), 8 << 20, i); },
                          [](kj::Exception&& e) {
                            auto code = errorCode(e);
                            return code == ErrorCode::MAY_HAVE_RUN ||
                                   code == ErrorCode::UNREACHABLE;
                          }));
    }
    server.process.kill(SIGKILL);
    server.process.wait();
    for (bool ok : kj::joinPromises(calls.releaseAsArray()).wait(loop.waitScope())) EXPECT_TRUE(ok);
    ref.channel().disconnect();
    runUntil(loop, [&]() { return regionsMapped() == 0; });
  }
  ::unlink(path.c_str());
  ::rmdir(dir.c_str());
}

}  // namespace
}  // namespace troupe
