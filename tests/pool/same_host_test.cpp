// Same host: an ActorGroup reaches a member on its own host through the unix socket the member's
// server publishes (ActorServerOptions::sameHost), and through the published TCP address when
// either side turned that off, the member is on another host, or the socket is not this user's;
// another user cannot reach the socket at all.

#include "troupe/net/same_host.h"

#include <netinet/in.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include "troupe/actor/actor_server.h"
#include "troupe/actor/blob.h"
#include "troupe/base/errors.h"
#include "troupe/pool/actor_pool.h"
#include "troupe/resolver/endpoint_publisher.h"
#include "troupe/resolver/fixed_resolver.h"
#include "tests/support/registry_helpers.h"
#include "tests/support/test_actors.h"

namespace troupe {
namespace {

using test::awaitError;
using test::Member;

class SameHostTest : public ::testing::Test {
protected:
  SameHostTest() {
    // A port bound and never listened on: a connection there is refused.
    closed = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(addr);
    KJ_SYSCALL(::bind(closed, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)));
    KJ_SYSCALL(::getsockname(closed, reinterpret_cast<sockaddr*>(&addr), &len));
    deadAddress = "tcp://127.0.0.1:" + std::to_string(ntohs(addr.sin_port));
  }
  ~SameHostTest() noexcept override { ::close(closed); }

  // A server of job "job-1" hosting "member", listening on TCP but publishing deadAddress: only
  // its same-host socket, if it has one, reaches it.
  void startServer(bool sameHost) {
    JobContext job;
    job.jobId = "job-1";
    ActorServerOptions options;
    options.advertiseAddress = deadAddress;
    options.sameHost = sameHost;
    server = kj::heap<ActorServer>(loop, job, kj::mv(options));
    server->host<Member>("member", kj::heap<test::MemberImpl>("m-0"));
    publisher = kj::heap<EndpointPublisher>(*server, resolver);
    server->listen("tcp://127.0.0.1:0");
  }

  void chainOnThisHost(bool reads);

  Endpoint member(ActorGroup<Member>& group) {
    auto ready = group.waitReady(1, 10 * kj::SECONDS).wait(loop.waitScope());
    KJ_ASSERT(ready.size() == 1);
    return ready[0];
  }

  kj::Promise<capnp::Response<Member::WhoamiResults>> whoami(ActorGroup<Member>& group) {
    auto pool = kj::heap<ActorPool<Member>>(group);
    return pool
        ->call([](Member::Client c) { return c.whoamiRequest().send(); },
               {.deadline = 2 * kj::SECONDS})
        .attach(kj::mv(pool));
  }

  EventLoop loop;
  FixedResolver resolver;
  int closed;
  std::string deadAddress;
  kj::Own<ActorServer> server;
  kj::Own<EndpointPublisher> publisher;
};

TEST_F(SameHostTest, AMemberOnThisHostIsCalledThroughItsSameHostSocket) {
  startServer(true);
  ActorGroup<Member> group(loop, resolver, "job-1", "member");
  auto endpoint = member(group);
  ASSERT_EQ(endpoint.address, deadAddress);
  auto path = endpoint.metadata.at(SAME_HOST_SOCKET_KEY);
  EXPECT_EQ(endpoint.metadata.at(SAME_HOST_ID_KEY), sameHostId());
  EXPECT_TRUE(isOwnSocket(path)) << path;
  EXPECT_EQ(connectAddress(endpoint), "unix:" + path);
  EXPECT_EQ(kj::StringPtr(whoami(group).wait(loop.waitScope()).getName()), "m-0");
  // The socket goes with its server.
  publisher = nullptr;
  server = nullptr;
  struct stat st;
  EXPECT_NE(::lstat(path.c_str(), &st), 0) << path << " is still there";
}

TEST_F(SameHostTest, WithSameHostOffOnEitherSideTheCallGoesToThePublishedAddress) {
  startServer(false);
  {
    ActorGroup<Member> group(loop, resolver, "job-1", "member");
    auto endpoint = member(group);
    EXPECT_EQ(endpoint.metadata.count(SAME_HOST_SOCKET_KEY), 0u);
    auto failure = awaitError(loop, whoami(group));
    EXPECT_TRUE(failure.mentions(deadAddress.substr(strlen("tcp://")).c_str())) << failure.text;
  }
  publisher = nullptr;
  server = nullptr;
  startServer(true);
  ActorGroup<Member> group(loop, resolver, "job-1", "member", {.sameHost = false});
  auto endpoint = member(group);
  EXPECT_EQ(endpoint.metadata.count(SAME_HOST_SOCKET_KEY), 1u);
  auto failure = awaitError(loop, whoami(group));
  EXPECT_TRUE(failure.mentions(deadAddress.substr(strlen("tcp://")).c_str())) << failure.text;
}

TEST_F(SameHostTest, AnotherHostsSocketOrOneNotOfThisUserIsNotUsed) {
  startServer(true);
  ActorGroup<Member> group(loop, resolver, "job-1", "member");
  auto endpoint = member(group);
  auto path = endpoint.metadata.at(SAME_HOST_SOCKET_KEY);
  auto elsewhere = endpoint;
  elsewhere.metadata[SAME_HOST_ID_KEY] = "another-boot/4026531840";
  EXPECT_EQ(connectAddress(elsewhere), deadAddress);
  auto notASocket = endpoint;
  notASocket.metadata[SAME_HOST_SOCKET_KEY] = "/proc/self/status";
  EXPECT_EQ(connectAddress(notASocket), deadAddress);
  if (::getuid() != 0) GTEST_SKIP() << "a socket of another user's needs root to make";
  // As root, hand the socket to another user: this process no longer takes it for its own.
  KJ_SYSCALL(::lchown(path.c_str(), 65534, 65534));
  EXPECT_EQ(connectAddress(endpoint), deadAddress);
  KJ_SYSCALL(::lchown(path.c_str(), 0, 0));
}

TEST_F(SameHostTest, AnotherUserCannotReachTheSocket) {
  if (::getuid() != 0) GTEST_SKIP() << "switching to another user needs root";
  startServer(true);
  ActorGroup<Member> group(loop, resolver, "job-1", "member");
  auto path = member(group).metadata.at(SAME_HOST_SOCKET_KEY);
  // A child process that becomes user nobody and connects: the socket's directory keeps it out.
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    if (::setgid(65534) != 0 || ::setuid(65534) != 0) _exit(2);
    int s = ::socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
    int r = ::connect(s, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
    _exit(r != 0 && errno == EACCES ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "2: could not switch user; 1: connected or another error";
}

TEST_F(SameHostTest, SocketsLeftByKilledServersAreRemovedAndLiveOnesKept) {
  startServer(true);
  ActorGroup<Member> group(loop, resolver, "job-1", "member");
  auto live = member(group).metadata.at(SAME_HOST_SOCKET_KEY);
  auto dir = live.substr(0, live.rfind('/'));
  // The socket of a process that is gone (a child that has exited and been waited for).
  pid_t gone = ::fork();
  ASSERT_GE(gone, 0);
  if (gone == 0) _exit(0);
  ASSERT_EQ(::waitpid(gone, nullptr, 0), gone);
  auto stale = dir + "/" + sameHostSocketName(42);
  stale.replace(stale.rfind('-') + 1, std::string::npos, std::to_string(gone) + ".sock");
  int s = ::socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  strncpy(addr.sun_path, stale.c_str(), sizeof(addr.sun_path) - 1);
  KJ_SYSCALL(::bind(s, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)));
  ::close(s);
  ASSERT_TRUE(isOwnSocket(stale));
  EXPECT_GE(removeStaleSockets(dir), 1u);
  EXPECT_FALSE(isOwnSocket(stale));
  EXPECT_TRUE(isOwnSocket(live));
  EXPECT_EQ(kj::StringPtr(whoami(group).wait(loop.waitScope()).getName()), "m-0");
}

TEST_F(SameHostTest, ADirectoryOthersCanEnterIsRefusedAndTheServerServesTcpAlone) {
  char dir[] = "/tmp/troupe-same-host-test-XXXXXX";
  ASSERT_NE(::mkdtemp(dir), nullptr);
  auto sockets = std::string(dir) + "/troupe";
  KJ_SYSCALL(::mkdir(sockets.c_str(), 0755));
  KJ_SYSCALL(::chmod(sockets.c_str(), 0755));
  const char* before = getenv("XDG_RUNTIME_DIR");
  std::string saved = before == nullptr ? "" : before;
  ::setenv("XDG_RUNTIME_DIR", dir, 1);
  startServer(true);
  if (saved.empty()) {
    ::unsetenv("XDG_RUNTIME_DIR");
  } else {
    ::setenv("XDG_RUNTIME_DIR", saved.c_str(), 1);
  }
  ActorGroup<Member> group(loop, resolver, "job-1", "member");
  EXPECT_EQ(member(group).metadata.count(SAME_HOST_SOCKET_KEY), 0u);
  ::rmdir(sockets.c_str());
  ::rmdir(dir);
}

// A blob broadcast along a chain of members on this host: the sender reaches the first, and the
// first the second, through their same-host sockets (their published addresses answer nothing).
// With `reads`, each member reads every chunk out of the memory of whoever sends to it; without,
// every chunk moves through the connection's shared memory.
void SameHostTest::chainOnThisHost(bool reads) {
  struct Receiver {
    kj::Own<ActorServer> server;
    kj::Own<EndpointPublisher> publisher;
    std::vector<Blob> received;
    int closed = -1;
  };
  std::vector<kj::Own<Receiver>> receivers;
  for (uint32_t i = 0; i < 2; ++i) {
    auto r = kj::heap<Receiver>();
    auto& receiver = *r;
    // A published address of its own where nothing answers.
    receiver.closed = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(addr);
    KJ_SYSCALL(::bind(receiver.closed, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)));
    KJ_SYSCALL(::getsockname(receiver.closed, reinterpret_cast<sockaddr*>(&addr), &len));
    JobContext job;
    job.jobId = "job-1";
    job.taskIndex = i;
    ActorServerOptions options;
    options.advertiseAddress = "tcp://127.0.0.1:" + std::to_string(ntohs(addr.sin_port));
    receiver.server = kj::heap<ActorServer>(loop, job, kj::mv(options));
    receiver.server->host<Member>("member",
                                  kj::heap<test::MemberImpl>(("m-" + std::to_string(i)).c_str()));
    receiver.server->acceptBlobs(
        "weights", [](const BlobHeader& h) { return kj::heapArray<kj::byte>(h.size); },
        [&receiver](Blob b) { receiver.received.push_back(kj::mv(b)); });
    receiver.publisher = kj::heap<EndpointPublisher>(*receiver.server, resolver);
    receiver.server->listen("tcp://127.0.0.1:0");
    receivers.push_back(kj::mv(r));
  }
  ActorGroup<Member> group(loop, resolver, "job-1", "member");
  ASSERT_EQ(group.waitReady(2, 10 * kj::SECONDS).wait(loop.waitScope()).size(), 2u);
  ActorPool<Member> pool(group);

  auto bytes = kj::heapArray<kj::byte>(8 << 20);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<kj::byte>(i * 13 + i / 4096);
  kj::Array<const kj::byte> copy = kj::heapArray<kj::byte>(bytes.asPtr());
  auto transfer =
      pool.broadcastBlob("weights", 1, kj::mv(copy),
                         {.fanout = Fanout::CHAIN, .chunkBytes = 1 << 20, .sameHostReads = reads});
  auto results = transfer.waitAll(30 * kj::SECONDS).wait(loop.waitScope());
  ASSERT_EQ(results.size(), 2u);
  for (auto& result : results) {
    KJ_IF_MAYBE(e, result.error) {
      ADD_FAILURE() << result.endpoint << ": " << e->getDescription().cStr();
    }
    // Each member's own word on how its bytes came.
    EXPECT_EQ(result.pulledBytes, reads ? bytes.size() : 0u) << result.endpoint;
  }
  for (auto& r : receivers) {
    ASSERT_EQ(r->received.size(), 1u);
    EXPECT_TRUE(r->received[0].bytes.slice(0, bytes.size()) == bytes.asPtr());
    auto read = r->server->metrics().sum("troupe_blob_sender_memory_read_bytes_total");
    auto shared = r->server->metrics().sum("troupe_shared_messages_received_total");
    if (reads) {
      // Every byte read from the sender's memory, the second's from the first's.
      EXPECT_EQ(read, bytes.size());
      EXPECT_LT(shared, 8);
    } else {
      // Eight chunks each, through shared memory: the second's came from the first.
      EXPECT_EQ(read, 0);
      EXPECT_GE(shared, 8);
    }
  }
  for (auto& r : receivers) {
    r->publisher = nullptr;
    r->server = nullptr;
    ::close(r->closed);
  }
}

TEST_F(SameHostTest, ABlobChainOnThisHostReadsEachChunkOutOfTheSendersMemoryHopToHop) {
  chainOnThisHost(true);
}

TEST_F(SameHostTest, ABlobChainOnThisHostMovesItsChunksThroughSharedMemoryWithoutReads) {
  chainOnThisHost(false);
}

}  // namespace
}  // namespace troupe
