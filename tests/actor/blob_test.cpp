// Blobs (blob.h) between ActorServers and a sender on one loop, over real sockets on port 0:
// exact bytes at every member for each fanout, refusals before any byte moves, a member that dies
// mid-transfer routed around, and the receiver's side of bad chunks, superseded senders and a
// sender that goes silent (on the manual clock), each freeing what it held.

#include "troupe/actor/blob.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <map>
#include <random>

#include <gtest/gtest.h>
#include <kj/debug.h>

#include "troupe/actor/actor_server.h"
#include "troupe/actor/detail/blob_fanout.h"
#include "troupe/actor/detail/sender_memory.h"
#include "troupe/base/errors.h"
#include "troupe/net/bytes.h"
#include "troupe/net/channel.h"
#include "tests/support/registry_helpers.h"

namespace troupe {
namespace {

using test::await;
using test::awaitError;

// Hands out arrays whose bytes it counts until they are freed, and tells a waiter when none is
// left.
class CountingAllocator final : public kj::ArrayDisposer {
public:
  // From allocateBlobMemory(), as a receiver's allocator would take it.
  kj::Array<kj::byte> allocate(size_t n) {
    live += n;
    ++made;
    auto memory = allocateBlobMemory(n);
    auto* at = memory.begin();
    held.emplace(at, kj::mv(memory));
    return kj::Array<kj::byte>(at, n, *this);
  }

  // Resolves once every array made has been freed.
  kj::Promise<void> whenAllFreed() {
    if (live == 0) return kj::READY_NOW;
    auto paf = kj::newPromiseAndFulfiller<void>();
    freed = kj::mv(paf.fulfiller);
    return kj::mv(paf.promise);
  }

  size_t live = 0;
  size_t made = 0;

private:
  void disposeImpl(void* first, size_t, size_t count, size_t, void (*)(void*)) const override {
    auto& self = const_cast<CountingAllocator&>(*this);
    self.held.erase(static_cast<kj::byte*>(first));
    self.live -= count;
    if (self.live == 0) {
      KJ_IF_MAYBE(f, self.freed) {
        (*f)->fulfill();
        self.freed = nullptr;
      }
    }
  }

  kj::Maybe<kj::Own<kj::PromiseFulfiller<void>>> freed;
  std::map<kj::byte*, kj::Array<kj::byte>> held;  // what allocate() handed out, by address
};

// One receiving server: what it was handed, and what it gave up.
struct Member {
  CountingAllocator memory;  // first: outlives the blobs and the server that hold its arrays
  std::string endpoint;
  std::string address;
  kj::Own<ActorServer> server;
  std::vector<Blob> received;
  std::vector<std::string> gaveUp;
  kj::Maybe<kj::String> refusal;  // the allocator throws this
};

class BlobTest : public ::testing::Test {
protected:
  BlobTest() : loop(EventLoopOptions{.manualClock = true}) {}
  ~BlobTest() noexcept override {}

  // A member accepting blobs named `name` with `options` (the callbacks are the test's own).
  Member& add(kj::StringPtr name = "weights", BlobAcceptOptions options = {}) {
    auto m = kj::heap<Member>();
    auto& member = *m;
    JobContext job;
    job.jobId = "blobs";
    job.taskIndex = members.size();
    member.endpoint = kj::str("blobs/ps-", members.size()).cStr();
    member.server = kj::heap<ActorServer>(loop, job);
    options.onGiveUp = [&member](const BlobHeader&, const kj::Exception& why) {
      member.gaveUp.push_back(why.getDescription().cStr());
    };
    member.server->acceptBlobs(
        name,
        [&member](const BlobHeader& h) {
          KJ_IF_MAYBE(why, member.refusal) {
            kj::throwFatalException(KJ_EXCEPTION(FAILED, *why));
          }
          return member.memory.allocate(h.size);
        },
        [&member](Blob b) { member.received.push_back(kj::mv(b)); }, kj::mv(options));
    member.address = member.server->listen("tcp://127.0.0.1:0");
    members.push_back(kj::mv(m));
    return member;
  }

  kj::Array<BlobTarget> targets() {
    return KJ_MAP(m, members) { return BlobTarget{m->endpoint, m->address}; };
  }

  static kj::Array<kj::byte> pattern(size_t size, uint32_t seed) {
    auto bytes = kj::heapArray<kj::byte>(size);
    std::mt19937 random(seed);
    for (auto& b : bytes) b = static_cast<kj::byte>(random());
    return bytes;
  }

  // Sends a copy of `bytes` to every member and waits for the results.
  kj::Array<BlobResult> send(kj::ArrayPtr<const kj::byte> bytes, uint64_t version,
                             BlobSendOptions options = {}) {
    kj::Array<const kj::byte> copy = kj::heapArray<kj::byte>(bytes);
    auto transfer = sendBlob(loop, targets(), "weights", version, kj::mv(copy), kj::mv(options));
    return await(loop, transfer.waitAll(60 * kj::SECONDS));
  }

  static BlobSendOptions small(Fanout fanout) {
    return {.fanout = fanout, .chunkBytes = 64 << 10, .windowBytes = 256 << 10};
  }

  EventLoop loop;
  std::vector<kj::Own<Member>> members;
};

void expectHolds(const Member& m, kj::ArrayPtr<const kj::byte> bytes, uint64_t version) {
  ASSERT_EQ(m.received.size(), 1u) << m.endpoint;
  auto& blob = m.received[0];
  EXPECT_EQ(blob.name, "weights");
  EXPECT_EQ(blob.version, version);
  ASSERT_EQ(blob.bytes.size(), bytes.size()) << m.endpoint;
  EXPECT_TRUE(blob.bytes == bytes) << m.endpoint << ": the bytes differ";
}

TEST_F(BlobTest, OneMemberGetsTheExactBytes) {
  auto& m = add();
  auto bytes = pattern((3 << 20) + 12345, 1);  // a last chunk of an odd size
  auto results = send(bytes, 7, small(Fanout::STAR));
  ASSERT_EQ(results.size(), 1u);
  EXPECT_TRUE(results[0].ok()) << KJ_ASSERT_NONNULL(results[0].error).getDescription().cStr();
  EXPECT_EQ(results[0].endpoint, m.endpoint);
  EXPECT_EQ(results[0].bytes, bytes.size());
  expectHolds(m, bytes, 7);
  // The memory stays the handler's until it lets go; the receiver keeps no copy.
  EXPECT_EQ(m.memory.live, bytes.size());
  m.received.clear();
  await(loop, m.memory.whenAllFreed());
}

TEST_F(BlobTest, ChainAndTreeDeliverToEveryMember) {
  for (int i = 0; i < 6; ++i) add();
  uint64_t version = 1;
  for (auto fanout : {Fanout::CHAIN, Fanout::TREE, Fanout::STAR}) {
    auto bytes = pattern((1 << 20) + 8 * version, version);
    auto results = send(bytes, version, small(fanout));
    ASSERT_EQ(results.size(), members.size());
    for (size_t i = 0; i < members.size(); ++i) {
      SCOPED_TRACE(members[i]->endpoint);
      EXPECT_EQ(results[i].endpoint, members[i]->endpoint);
      EXPECT_TRUE(results[i].ok());
      EXPECT_EQ(results[i].bytes, bytes.size());
      expectHolds(*members[i], bytes, version);
      members[i]->received.clear();
    }
    // Once the handlers let go, no member holds the blob, forwarders included.
    for (auto& m : members) await(loop, m->memory.whenAllFreed());
    ++version;
  }
}

TEST_F(BlobTest, TheLayoutsForwardAsDocumented) {
  auto named = [](size_t n) {
    return KJ_MAP(i, kj::range<size_t>(0, n)) {
      return BlobTarget{kj::str("m", i).cStr(), "tcp://127.0.0.1:1"};
    };
  };
  auto describe = [](auto& self, const std::vector<actor_detail::BlobHop>& hops) -> std::string {
    std::string out;
    for (auto& h : hops) {
      out += (out.empty() ? "" : " ") + h.endpoint;
      if (!h.children.empty()) out += "(" + self(self, h.children) + ")";
    }
    return out;
  };
  auto seven = named(7);
  EXPECT_EQ(describe(describe, actor_detail::layOut(seven, Fanout::STAR, 2)),
            "m0 m1 m2 m3 m4 m5 m6");
  EXPECT_EQ(describe(describe, actor_detail::layOut(seven, Fanout::CHAIN, 2)),
            "m0(m1(m2(m3(m4(m5(m6))))))");
  EXPECT_EQ(describe(describe, actor_detail::layOut(seven, Fanout::TREE, 2)),
            "m0(m2(m6) m3) m1(m4 m5)");
  EXPECT_EQ(describe(describe, actor_detail::layOut(seven, Fanout::TREE, 3)),
            "m0(m3 m4 m5) m1(m6) m2");
}

std::string describe(const kj::Maybe<kj::Exception>& e) {
  KJ_IF_MAYBE(x, e) {
    return x->getDescription().cStr();
  }
  return "ok";
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST_F(BlobTest, RefusalsComeFirstAndTheMembersBehindThemStillGetTheBlob) {
  auto& stranger = add("other");  // accepts no blob named "weights"
  auto& full = add();
  full.refusal = kj::str("no room for it");
  add();
  add();
  auto bytes = pattern(1 << 20, 3);
  auto results = send(bytes, 1, small(Fanout::CHAIN));
  ASSERT_EQ(results.size(), 4u);
  EXPECT_EQ(errorCode(KJ_ASSERT_NONNULL(results[0].error)), ErrorCode::BLOB_REFUSED);
  EXPECT_TRUE(contains(describe(results[0].error), "no receiver of blobs named 'weights'"))
      << describe(results[0].error);
  EXPECT_TRUE(contains(describe(results[0].error), "blobs/ps-0")) << describe(results[0].error);
  EXPECT_EQ(errorCode(KJ_ASSERT_NONNULL(results[1].error)), ErrorCode::BLOB_REFUSED);
  EXPECT_TRUE(contains(describe(results[1].error), "no room for it")) << describe(results[1].error);
  EXPECT_EQ(results[0].bytes + results[1].bytes, 0u);
  EXPECT_EQ(stranger.memory.made + full.memory.made, 0u);
  for (size_t i = 2; i < 4; ++i) {
    EXPECT_TRUE(results[i].ok()) << describe(results[i].error);
    expectHolds(*members[i], bytes, 1);
  }
}

TEST_F(BlobTest, StaleVersionsAndOversizeBlobsAreRefused) {
  auto& m = add("weights", {.maxBytes = 2 << 20});
  auto bytes = pattern(1 << 20, 4);
  EXPECT_TRUE(send(bytes, 5, small(Fanout::STAR))[0].ok());
  for (uint64_t version : {5, 4}) {
    auto results = send(bytes, version, small(Fanout::STAR));
    EXPECT_EQ(errorCode(KJ_ASSERT_NONNULL(results[0].error)), ErrorCode::BLOB_REFUSED);
    EXPECT_TRUE(contains(describe(results[0].error), "stale: this receiver has version 5"))
        << describe(results[0].error);
  }
  auto big = pattern((2 << 20) + 8, 5);
  auto results = send(big, 6, small(Fanout::STAR));
  EXPECT_TRUE(contains(describe(results[0].error), "larger than this receiver's limit"))
      << describe(results[0].error);
  EXPECT_EQ(m.received.size(), 1u);
  EXPECT_EQ(m.memory.made, 1u);
}

TEST_F(BlobTest, AMemberThatDiesMidTransferIsRoutedAround) {
  for (int i = 0; i < 4; ++i) add();
  // Member 1 dies (its server goes, and with it its connections) once it has 256 KiB.
  auto& victim = *members[1];
  struct : kj::TaskSet::ErrorHandler {
    void taskFailed(kj::Exception&& e) override { ADD_FAILURE() << e.getDescription().cStr(); }
  } onError;
  kj::TaskSet tasks(onError);
  victim.server = nullptr;
  JobContext job;
  job.jobId = "blobs";
  job.taskIndex = 1;
  victim.server = kj::heap<ActorServer>(loop, job);
  BlobAcceptOptions options;
  bool dying = false;
  options.onProgress = [&](const BlobHeader&, uint64_t received) {
    if (received < (256 << 10) || dying) return;
    dying = true;
    tasks.add(kj::evalLater([&]() { victim.server = nullptr; }));
  };
  victim.server->acceptBlobs(
      "weights", [&](const BlobHeader& h) { return victim.memory.allocate(h.size); },
      [&](Blob b) { victim.received.push_back(kj::mv(b)); }, kj::mv(options));
  victim.address = victim.server->listen("tcp://127.0.0.1:0");

  auto bytes = pattern(2 << 20, 6);
  auto results = send(bytes, 1, small(Fanout::CHAIN));
  ASSERT_TRUE(dying);
  EXPECT_FALSE(results[1].ok());
  EXPECT_TRUE(contains(describe(results[1].error), victim.endpoint)) << describe(results[1].error);
  EXPECT_LT(results[1].bytes, bytes.size());  // what it acknowledged before it died
  EXPECT_TRUE(victim.received.empty());
  for (size_t i : {0, 2, 3}) {
    EXPECT_TRUE(results[i].ok()) << members[i]->endpoint << ": " << describe(results[i].error);
    expectHolds(*members[i], bytes, 1);
  }
  // What the dead member held is freed.
  await(loop, victim.memory.whenAllFreed());
}

// The wire, driven directly: what a receiver does with a sender that breaks the rules.
class BlobWireTest : public BlobTest {
protected:
  BlobWireTest() : member(add("weights", {.idleTimeout = 5 * kj::SECONDS})) {
    channel = Channel::open(loop, member.address.c_str());
  }
  ~BlobWireTest() noexcept override {}

  // Opens transfer `id` of a blob of `size` bytes in chunks of `chunk` bytes.
  schema::BlobSink::Client open(uint64_t id, uint64_t size, uint64_t version = 1,
                                uint64_t resumeAt = 0, uint32_t chunk = 4096) {
    transfers[sinkKey++] = id;
    auto request = channel->host().receiveBlobRequest();
    auto h = request.initHeader();
    h.setName("weights");
    h.setVersion(version);
    h.setSize(size);
    h.setTransfer(id);
    h.setChunkBytes(chunk);
    h.setWindowBytes(1 << 20);
    h.setStallMillis(1000);
    auto response = await(loop, request.send());
    EXPECT_EQ(response.getResumeAt(), resumeAt);
    return response.getSink();
  }

  // A chunk of the transfer opened last (or of `transfer`).
  kj::Promise<capnp::Response<schema::BlobSink::WriteResults>> write(
      schema::BlobSink::Client& sink, uint64_t offset, kj::ArrayPtr<const kj::byte> data,
      kj::Maybe<uint64_t> checksum = nullptr, kj::Maybe<uint64_t> transfer = nullptr) {
    auto request = sink.writeRequest();
    request.setTransfer(transfer.orDefault(transfers[sinkKey - 1]));
    request.setOffset(offset);
    request.setData(data);
    request.setChecksum(checksum.orDefault(actor_detail::blobChecksum(data)));
    return request.send();
  }

  Member& member;
  kj::Own<Channel> channel;
  std::map<int, uint64_t> transfers;  // the ids opened, in order
  int sinkKey = 0;
};

TEST_F(BlobWireTest, AChunkThatFailsItsChecksumGivesTheTransferUpAndFreesIt) {
  auto bytes = pattern(3 * 4096, 7);
  auto sink = open(1, bytes.size());
  await(loop, write(sink, 0, bytes.slice(0, 4096)));
  auto e = awaitError(loop, write(sink, 4096, bytes.slice(4096, 8192), uint64_t{42}));
  EXPECT_EQ(e.code, ErrorCode::BLOB_ABORTED) << e.text;
  EXPECT_TRUE(contains(e.text, "the chunk at byte 4096 failed its checksum")) << e.text;
  ASSERT_EQ(member.gaveUp.size(), 1u);
  await(loop, member.memory.whenAllFreed());
  // Later writes are refused the same way; nothing was handed over.
  e = awaitError(loop, write(sink, 4096, bytes.slice(4096, 8192)));
  EXPECT_EQ(e.code, ErrorCode::BLOB_ABORTED) << e.text;
  EXPECT_TRUE(member.received.empty());
}

TEST_F(BlobWireTest, LargeChunksCopiedIntoPlaceArriveExactAndAreChecked) {
  // Chunks in the message (not read into place) are checked as they are copied, a step at a
  // time: sizes that are not a whole number of steps, at offsets that are not either.
  constexpr uint32_t chunk = (1 << 20) + 8;
  auto bytes = pattern(3 * chunk + 1000, 13);
  auto sink = open(31, bytes.size(), 1, 0, chunk);
  for (uint64_t offset = 0; offset < bytes.size(); offset += chunk) {
    auto end = std::min<uint64_t>(offset + chunk, bytes.size());
    await(loop, write(sink, offset, bytes.slice(offset, end)));
  }
  expectHolds(member, bytes, 1);
  member.received.clear();
  await(loop, member.memory.whenAllFreed());

  // A byte changed in the last step of a chunk is caught, and the transfer given up.
  auto changed = kj::heapArray<kj::byte>(bytes.slice(0, chunk));
  auto sum = actor_detail::blobChecksum(changed);
  changed[chunk - 3] ^= 1;
  sink = open(32, bytes.size(), 2, 0, chunk);
  auto e = awaitError(loop, write(sink, 0, changed, sum));
  EXPECT_EQ(e.code, ErrorCode::BLOB_ABORTED) << e.text;
  EXPECT_TRUE(contains(e.text, "the chunk at byte 0 failed its checksum")) << e.text;
  await(loop, member.memory.whenAllFreed());
  EXPECT_TRUE(member.received.empty());
}

TEST_F(BlobWireTest, AChunkReadStraightIntoPlaceIsCheckedLikeAnyOther) {
  // 64 KiB chunks sent as their message's own segment (adoptBytes), as senders send them: the
  // server reads them into the blob before serving the write.
  auto bytes = pattern(2 << 16, 11);
  auto sink = open(21, bytes.size(), 1, 0, 1 << 16);
  auto placed = [&](uint64_t offset, kj::Maybe<uint64_t> checksum, uint64_t transfer) {
    auto chunk = bytes.slice(offset, offset + (1 << 16));
    auto request = sink.writeRequest();
    request.setTransfer(transfer);
    request.setOffset(offset);
    request.setChecksum(checksum.orDefault(actor_detail::blobChecksum(chunk)));
    kj::Array<const kj::byte> copy = kj::heapArray<kj::byte>(chunk);
    EXPECT_TRUE(
        adoptBytes(request, &schema::BlobSink::WriteParams::Builder::adoptData, kj::mv(copy)));
    return request.send();
  };
  await(loop, placed(0, nullptr, 21));
  // A chunk naming another transfer is refused, and gives this one up.
  auto e = awaitError(loop, placed(1 << 16, nullptr, 22));
  EXPECT_EQ(e.code, ErrorCode::BLOB_ABORTED) << e.text;
  EXPECT_TRUE(contains(e.text, "a chunk of transfer 22 came to the sink of transfer 21")) << e.text;
  await(loop, member.memory.whenAllFreed());

  auto again = open(23, bytes.size(), 2, 0, 1 << 16);
  sink = kj::mv(again);
  e = awaitError(loop, placed(0, uint64_t{42}, 23));
  EXPECT_TRUE(contains(e.text, "the chunk at byte 0 failed its checksum")) << e.text;
  await(loop, member.memory.whenAllFreed());
  EXPECT_TRUE(member.received.empty());
}

TEST_F(BlobWireTest, ChunksOutOfOrderOrOfTheWrongSizeAreRefused) {
  auto bytes = pattern(3 * 4096, 8);
  auto sink = open(1, bytes.size());
  auto e = awaitError(loop, write(sink, 4096, bytes.slice(4096, 8192)));
  EXPECT_TRUE(contains(e.text, "the chunk at byte 4096 came when byte 0 was due")) << e.text;
  auto again = open(2, bytes.size());
  e = awaitError(loop, write(again, 0, bytes.slice(0, 100)));
  EXPECT_TRUE(contains(e.text, "holds 100 bytes, not 4096")) << e.text;
  await(loop, member.memory.whenAllFreed());
}

TEST_F(BlobWireTest, ANewSenderResumesWhereTheOldOneStoppedAndSupersedesIt) {
  auto bytes = pattern(3 * 4096 + 8, 9);
  auto first = open(7, bytes.size());
  await(loop, write(first, 0, bytes.slice(0, 4096)));
  // The same transfer again, as a parent taking over for a member that died: from byte 4096.
  auto second = open(7, bytes.size(), 1, 4096);
  EXPECT_TRUE(await(loop, write(first, 4096, bytes.slice(4096, 8192))).getSuperseded());
  EXPECT_FALSE(await(loop, write(second, 4096, bytes.slice(4096, 8192))).getSuperseded());
  EXPECT_FALSE(await(loop, write(second, 8192, bytes.slice(8192, 12288))).getSuperseded());
  // The old sender's abort is ignored.
  auto abort = first.abortRequest();
  abort.setReason("stale");
  await(loop, abort.send());
  await(loop, write(second, 12288, bytes.slice(12288, bytes.size())));
  expectHolds(member, bytes, 1);
  auto finished = await(loop, second.finishRequest().send());
  ASSERT_EQ(finished.getOutcomes().size(), 1u);
  EXPECT_TRUE(finished.getOutcomes()[0].getOk());
  EXPECT_TRUE(await(loop, first.finishRequest().send()).getSuperseded());
  // A transfer of another blob under the same id is refused.
  auto request = channel->host().receiveBlobRequest();
  request.initHeader().setName("weights");
  request.getHeader().setTransfer(7);
  request.getHeader().setVersion(2);
  request.getHeader().setSize(4096);
  request.getHeader().setChunkBytes(4096);
  auto e = awaitError(loop, request.send());
  EXPECT_EQ(e.code, ErrorCode::BLOB_REFUSED) << e.text;
}

TEST_F(BlobWireTest, ASenderThatGoesSilentIsGivenUpAfterTheIdleTimeout) {
  auto bytes = pattern(2 * 4096, 10);
  auto sink = open(3, bytes.size());
  await(loop, write(sink, 0, bytes.slice(0, 4096)));
  EXPECT_EQ(member.server->blobTransferCount(), 1u);
  loop.advanceTime(4 * kj::SECONDS);
  loop.waitScope().poll();
  EXPECT_TRUE(member.gaveUp.empty());
  loop.advanceTime(1 * kj::SECONDS + 1 * kj::MILLISECONDS);
  auto freed = member.memory.whenAllFreed();
  await(loop, kj::mv(freed));
  ASSERT_EQ(member.gaveUp.size(), 1u);
  EXPECT_TRUE(contains(member.gaveUp[0], "no chunk for 5000 ms")) << member.gaveUp[0];
  EXPECT_EQ(member.server->blobTransferCount(), 0u);
}

// A member on this host reads a sender's memory only where the sender is the process at the
// other end of its same-host connection, as the kernel knows it: a header naming any other
// process (here a child, which has the same bytes at the same address and which the member
// could read), or one that came over TCP, has its chunks sent.
TEST_F(BlobTest, AMemberReadsOnlyTheMemoryOfTheProcessAtTheOtherEndOfItsConnection) {
  auto& member = add();
  char dir[] = "/tmp/troupe-blob-test-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  auto socket = std::string(dir) + "/member.sock";
  auto local = Channel::open(loop, member.server->listen(("unix:" + socket).c_str()).c_str());
  auto tcp = Channel::open(loop, member.address.c_str());
  auto bytes = pattern(2 * 4096 + 8, 11);
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    pause();
    _exit(0);
  }
  KJ_DEFER({
    kill(child, SIGKILL);
    waitpid(child, nullptr, 0);
  });
  uint64_t id = 100;
  auto open = [&](Channel& channel, pid_t pid) {
    auto request = channel.host().receiveBlobRequest();
    auto h = request.initHeader();
    h.setName("weights");
    h.setVersion(id);
    h.setSize(bytes.size());
    h.setTransfer(id++);
    h.setChunkBytes(4096);
    h.setWindowBytes(1 << 20);
    h.setStallMillis(1000);
    h.setSenderPid(static_cast<uint32_t>(pid));
    h.setSenderMemory(reinterpret_cast<uintptr_t>(bytes.begin()));
    return await(loop, request.send());
  };
  auto readBytes = [&]() {
    return member.server->metrics().sum("troupe_blob_sender_memory_read_bytes_total");
  };
  auto write = [&](schema::BlobSink::Client& sink, uint64_t at, int64_t heldUntil) {
    auto request = sink.writeRequest();
    request.setTransfer(id - 1);
    request.setOffset(at);
    request.setPulled(true);
    request.setHeldUntil(heldUntil);
    return request.send();
  };
  EXPECT_FALSE(open(*local, child).getPulls());
  EXPECT_FALSE(open(*tcp, getpid()).getPulls());
  EXPECT_EQ(readBytes(), 0);
  // This process, at the other end of the unix socket: each chunk is read from its memory.
  auto response = open(*local, getpid());
  ASSERT_TRUE(response.getPulls());
  auto sink = response.getSink();
  auto held = actor_detail::SenderMemory::now() + (60 * kj::SECONDS) / kj::NANOSECONDS;
  for (uint64_t at = 0; at < bytes.size(); at += 4096) await(loop, write(sink, at, held));
  // Handed over only once the sender finished: its memory was surely the blob's.
  EXPECT_TRUE(member.received.empty());
  auto finished = await(loop, sink.finishRequest().send());
  ASSERT_EQ(finished.getOutcomes().size(), 1u);
  EXPECT_TRUE(finished.getOutcomes()[0].getOk());
  expectHolds(member, bytes, id - 1);
  EXPECT_EQ(readBytes(), bytes.size());

  // A chunk read after the sender's hold on its memory ended is not taken, nor those after it;
  // the transfer waits for another sender.
  response = open(*local, getpid());
  ASSERT_TRUE(response.getPulls());
  sink = response.getSink();
  auto givenUp = member.gaveUp.size();  // the transfers superseded above
  auto late = awaitError(loop, write(sink, 0, actor_detail::SenderMemory::now() - 1));
  EXPECT_EQ(late.code, ErrorCode::DISCONNECTED) << late.text;
  EXPECT_NE(late.text.find("hold on its memory ended"), std::string::npos) << late.text;
  EXPECT_EQ(awaitError(loop, write(sink, 0, held)).code, ErrorCode::DISCONNECTED);
  EXPECT_EQ(readBytes(), bytes.size());
  EXPECT_EQ(member.gaveUp.size(), givenUp);
  local = nullptr;
  member.server = nullptr;
  ::unlink(socket.c_str());
  ::rmdir(dir);
}

TEST_F(BlobWireTest, BadHopListsAndChunkSizesAreInvalidArguments) {
  auto attempt = [&](uint32_t chunkBytes, int32_t parent) {
    auto request = channel->host().receiveBlobRequest();
    auto h = request.initHeader();
    h.setName("weights");
    h.setSize(4096);
    h.setTransfer(9);
    h.setChunkBytes(chunkBytes);
    h.setWindowBytes(4096);
    h.setStallMillis(1000);
    auto hops = request.initHops(2);
    hops[0].setParent(parent);
    hops[1].setParent(0);
    return awaitError(loop, request.send());
  };
  auto e = attempt(4096, 1);  // a parent after its child
  EXPECT_EQ(e.code, ErrorCode::INVALID_ARGUMENT) << e.text;
  EXPECT_TRUE(contains(e.text, "names hop 1 as its parent")) << e.text;
  e = attempt(100, -1);
  EXPECT_EQ(e.code, ErrorCode::INVALID_ARGUMENT) << e.text;
  EXPECT_TRUE(contains(e.text, "chunks of 100 bytes")) << e.text;
  EXPECT_EQ(member.memory.made, 0u);
}

TEST(BlobChecksumTest, CopyWithChecksumCopiesEveryByteAndHashesAsBlobChecksumDoes) {
  // Both builds (the one this CPU runs, and the portable one), at sizes around the 32-byte
  // stores, the 128-byte loop and the 256 KiB steps, to and from every alignment.
  std::mt19937 random(17);
  auto from = kj::heapArray<kj::byte>((1 << 20) + 64);
  for (auto& b : from) b = static_cast<kj::byte>(random());
  auto to = kj::heapArray<kj::byte>(from.size() + 64);
  std::vector<size_t> sizes;
  for (size_t n = 0; n <= 300; ++n) sizes.push_back(n);
  for (size_t n : {size_t{4095}, size_t{(256 << 10) - 1}, size_t{256 << 10},
                   size_t{(256 << 10) + 1}, size_t{(1 << 20) + 8}}) {
    sizes.push_back(n);
  }
  for (bool portable : {false, true}) {
    for (size_t size : sizes) {
      for (size_t shift : {size_t{0}, size_t{1}, size_t{7}, size_t{31}}) {
        if (size > (1 << 20) + 8 && shift > 0) continue;
        auto source = from.slice(shift, shift + size);
        memset(to.begin(), 0xEE, to.size());
        kj::byte* into = to.begin() + (31 - shift);
        uint64_t sum = portable ? actor_detail::copyWithChecksumPortable(into, source)
                                : actor_detail::copyWithChecksum(into, source);
        ASSERT_EQ(sum, actor_detail::blobChecksum(source))
            << size << " " << shift << " " << portable;
        ASSERT_EQ(memcmp(into, source.begin(), size), 0) << size << " " << shift << " " << portable;
        // Nothing written around the copy.
        kj::byte* after = std::min(into + size + 64, to.end());
        ASSERT_TRUE(std::all_of(to.begin(), into, [](kj::byte b) { return b == 0xEE; }));
        ASSERT_TRUE(std::all_of(into + size, after, [](kj::byte b) { return b == 0xEE; }));
      }
    }
  }
}

TEST(BlobMemoryTest, AllocateBlobMemoryGivesWritableMemoryOfTheSizeAskedFor) {
  for (uint64_t size : {uint64_t{0}, uint64_t{1}, (uint64_t{8} << 20) - 1, uint64_t{8} << 20,
                        (uint64_t{8} << 20) + 3, (uint64_t{21} << 20) + 5}) {
    auto memory = allocateBlobMemory(size);
    ASSERT_EQ(memory.size(), size);
    if (size == 0) continue;
    // Every page is writable and keeps what was written, to the last byte.
    for (uint64_t at = 0; at < size; at += 4096) memory[at] = static_cast<kj::byte>(at / 4096);
    memory[size - 1] = 0xA5;
    for (uint64_t at = 0; at + 1 < size; at += 4096) {
      ASSERT_EQ(memory[at], static_cast<kj::byte>(at / 4096)) << size << " at " << at;
    }
    EXPECT_EQ(memory[size - 1], 0xA5);
    if (size >= (uint64_t{8} << 20)) {
      // Mapped on its own, on a huge page's boundary, as blob.h says.
      EXPECT_EQ(reinterpret_cast<uintptr_t>(memory.begin()) % (2 << 20), 0u) << size;
    }
  }
  // A size no memory holds is refused, not wrapped around.
  try {
    allocateBlobMemory(UINT64_MAX);
    ADD_FAILURE() << "a blob of 2^64 - 1 bytes was given memory";
  } catch (const kj::Exception& e) {
    EXPECT_EQ(errorCode(e), ErrorCode::INVALID_ARGUMENT) << e.getDescription().cStr();
  }
}

TEST_F(BlobTest, ALargeBlobLandsInMappedBlobMemoryWholeAndIsFreed) {
  // Over allocateBlobMemory()'s 8 MiB, so mapped in huge pages; its end off a 2 MiB boundary.
  auto& m = add();
  auto bytes = pattern((9 << 20) + 77, 5);
  auto results = send(bytes, 1);
  ASSERT_EQ(results.size(), 1u);
  EXPECT_TRUE(results[0].error == nullptr);
  expectHolds(m, bytes, 1);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(m.received[0].bytes.begin()) % (2 << 20), 0u);
  m.received.clear();
  await(loop, m.memory.whenAllFreed());
}

TEST_F(BlobTest, SendOptionsAreChecked) {
  add();
  auto bad = [&](BlobSendOptions o) {
    return test::thrownBy([&]() { sendBlob(loop, targets(), "weights", 1, pattern(8, 1), o); });
  };
  EXPECT_EQ(bad({.chunkBytes = 1000}).code, ErrorCode::INVALID_ARGUMENT);
  EXPECT_EQ(bad({.windowBytes = 0}).code, ErrorCode::INVALID_ARGUMENT);
  EXPECT_EQ(bad({.stallTimeout = 0 * kj::SECONDS}).code, ErrorCode::INVALID_ARGUMENT);
  auto e = test::thrownBy([&]() { sendBlob(loop, {}, "weights", 1, pattern(8, 1)); });
  EXPECT_EQ(e.code, ErrorCode::INVALID_ARGUMENT);
  e = test::thrownBy([&]() { sendBlob(loop, targets(), "bad name", 1, pattern(8, 1)); });
  EXPECT_EQ(e.code, ErrorCode::INVALID_ARGUMENT);
}

}  // namespace
}  // namespace troupe
