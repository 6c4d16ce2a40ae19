// Blobs in device memory (blob_device.h), over real sockets on port 0. Everywhere: the CUDA
// loader's answers where no runtime is, and the whole device path (staging ring, receiving into
// device memory, sending and forwarding from it) with host memory standing in for a device that
// faults on any direct touch (tests/support/host_blob_device.h). Where CUDA and a GPU are
// present, the same transfers into and out of the GPU; elsewhere those skip, saying why.

#include "troupe/actor/blob_device.h"

#include <random>

#include <gtest/gtest.h>
#include <kj/debug.h>

#include "troupe/actor/actor_server.h"
#include "troupe/actor/blob.h"
#include "troupe/actor/detail/cuda_runtime.h"
#include "troupe/actor/detail/staging_ring.h"
#include "troupe/base/errors.h"
#include "troupe/net/same_host.h"
#include "tests/support/host_blob_device.h"
#include "tests/support/registry_helpers.h"
#include "tests/support/test_actors.h"

namespace troupe {
namespace {

using test::await;

kj::Array<kj::byte> pattern(size_t size, uint32_t seed) {
  auto bytes = kj::heapArray<kj::byte>(size);
  std::mt19937 random(seed);
  for (auto& b : bytes) b = static_cast<kj::byte>(random());
  return bytes;
}

// --- The loader ------------------------------------------------------------------------------

TEST(CudaRuntimeTest, ALibraryThatIsNotThereIsReportedByName) {
  kj::StringPtr candidates[] = {"libtroupe-no-such-cudart.so.99"};
  auto loaded = actor_detail::loadCudaRuntime(candidates);
  EXPECT_EQ(loaded.api, nullptr);
  EXPECT_FALSE(loaded.info.available);
  EXPECT_NE(loaded.info.reason.find("libtroupe-no-such-cudart.so.99"), std::string::npos)
      << loaded.info.reason;
}

TEST(CudaRuntimeTest, ALibraryWithoutCudasEntryPointsIsNotTaken) {
  kj::StringPtr candidates[] = {"libc.so.6"};
  auto loaded = actor_detail::loadCudaRuntime(candidates);
  EXPECT_EQ(loaded.api, nullptr);
  EXPECT_NE(loaded.info.reason.find("libc.so.6: lacks cudaGetDeviceCount"), std::string::npos)
      << loaded.info.reason;
}

TEST(CudaRuntimeTest, WithoutCudaACudaDeviceIsRefusedSayingWhy) {
  auto& info = cudaRuntime();
  if (info.available) GTEST_SKIP() << "CUDA is available here (" << info.library << ")";
  EXPECT_FALSE(info.reason.empty());
  EventLoop loop;
  try {
    cudaBlobDevice(loop, 0);
    ADD_FAILURE() << "a CUDA device without CUDA";
  } catch (const kj::Exception& e) {
    EXPECT_EQ(errorCode(e), ErrorCode::UNIMPLEMENTED);
    EXPECT_NE(std::string(e.getDescription().cStr()).find(info.reason), std::string::npos)
        << e.getDescription().cStr();
  }
}

// --- The staging ring ------------------------------------------------------------------------

TEST(StagingRingTest, BuffersAreMadeAsNeededThenReusedAndATakerWaitsForOneGivenBack) {
  EventLoop loop;
  auto device = std::make_shared<test::HostBlobDevice>(loop);
  auto ring = kj::refcounted<actor_detail::StagingRing>(device, 4096, 2);
  auto a = KJ_ASSERT_NONNULL(ring->tryTake());
  auto b = KJ_ASSERT_NONNULL(ring->tryTake());
  EXPECT_EQ(device->stagingMade, 2u);
  EXPECT_EQ(ring->tryTake(), nullptr);
  auto waiting = ring->take();
  EXPECT_FALSE(waiting.poll(loop.waitScope()));
  auto* given = a.begin();
  a = nullptr;
  auto c = waiting.wait(loop.waitScope());
  EXPECT_EQ(c.begin(), given);
  EXPECT_EQ(c.size(), 4096u);
  EXPECT_EQ(device->stagingMade, 2u);                                        // reused, not made
  EXPECT_EQ(actor_detail::StagingRing::buffersFor(4 << 20, 64 << 20), 18u);  // a window and 2
  EXPECT_EQ(actor_detail::StagingRing::buffersFor(64 << 20, 64 << 20), 3u);
  EXPECT_EQ(actor_detail::StagingRing::buffersFor(4 << 10, 64 << 20), 64u);
}

// --- Transfers, with host memory standing in for a device -------------------------------------

// One receiving server, into host memory or into a device's.
struct Member {
  std::shared_ptr<BlobDevice> device;  // null: host memory
  std::string endpoint;
  std::string address;
  std::string socket;  // its server's same-host socket, and that host's id
  std::string host;
  kj::Own<ActorServer> server;
  std::vector<Blob> received;
};

class BlobDeviceTest : public ::testing::Test {
protected:
  BlobDeviceTest() : device(std::make_shared<test::HostBlobDevice>(loop)) {}
  ~BlobDeviceTest() noexcept override {
    for (auto& m : members) m->received.clear();
    members.clear();
  }

  Member& add(std::shared_ptr<BlobDevice> on, BlobAcceptOptions options = {}) {
    auto m = kj::heap<Member>();
    auto& member = *m;
    member.device = on;
    JobContext job;
    job.jobId = "blobs";
    job.taskIndex = members.size();
    member.endpoint = kj::str("blobs/gpu-", members.size()).cStr();
    member.server = kj::heap<ActorServer>(loop, job);
    options.device = on;
    member.server->acceptBlobs(
        "weights",
        [on](const BlobHeader& h) {
          return on == nullptr ? kj::heapArray<kj::byte>(h.size) : on->allocate(h.size);
        },
        [&member](Blob b) { member.received.push_back(kj::mv(b)); }, kj::mv(options));
    // An actor, for an endpoint that says where the server's same-host socket is.
    member.server->host<test::Member>("m", kj::heap<test::MemberImpl>(member.endpoint));
    member.address = member.server->listen("tcp://127.0.0.1:0");
    auto endpoints = member.server->endpoints();
    member.socket = endpoints[0].metadata.at(SAME_HOST_SOCKET_KEY);
    member.host = endpoints[0].metadata.at(SAME_HOST_ID_KEY);
    members.push_back(kj::mv(m));
    return member;
  }

  // Sends `bytes` (in `from`'s memory, or host memory) to every member; `sameHost`: through
  // their same-host sockets.
  kj::Array<BlobResult> send(kj::Array<const kj::byte> bytes, Fanout fanout,
                             std::shared_ptr<BlobDevice> from, bool sameHost = false) {
    auto targets = KJ_MAP(m, members) {
      if (!sameHost) return BlobTarget{m->endpoint, m->address};
      return BlobTarget{m->endpoint, m->address, m->socket, m->host};
    };
    BlobSendOptions options{.fanout = fanout, .chunkBytes = 64 << 10, .windowBytes = 512 << 10};
    options.device = kj::mv(from);
    auto transfer = sendBlob(loop, targets, "weights", 1, kj::mv(bytes), kj::mv(options));
    return await(loop, transfer.waitAll(60 * kj::SECONDS));
  }

  // What member `m` holds, read back to host memory.
  kj::Array<kj::byte> holding(Member& m) {
    KJ_REQUIRE(m.received.size() == 1, m.endpoint, m.received.size());
    auto& blob = m.received[0];
    if (blob.device == nullptr) return kj::heapArray<kj::byte>(blob.bytes);
    KJ_REQUIRE(blob.device == m.device, "the blob names another device");
    return device->read(loop.waitScope(), blob.bytes.begin(), blob.bytes.size());
  }

  void expectAllHold(kj::ArrayPtr<const kj::byte> bytes, kj::ArrayPtr<const BlobResult> results) {
    ASSERT_EQ(results.size(), members.size());
    for (size_t i = 0; i < members.size(); ++i) {
      SCOPED_TRACE(members[i]->endpoint);
      KJ_IF_MAYBE(e, results[i].error) {
        ADD_FAILURE() << e->getDescription().cStr();
      }
      EXPECT_EQ(members[i]->received.size(), 1u);
      if (members[i]->received.size() != 1) continue;
      EXPECT_TRUE(holding(*members[i]) == bytes) << "the bytes differ";
    }
  }

  EventLoop loop;
  std::shared_ptr<test::HostBlobDevice> device;
  std::vector<kj::Own<Member>> members;
};

TEST_F(BlobDeviceTest, ABlobLandsInDeviceMemoryThroughTheStagingRing) {
  auto& m = add(device);
  auto bytes = pattern((2 << 20) + 4104, 1);  // 33 chunks of 64 KiB, the last of 4104 bytes
  auto results = send(kj::heapArray<kj::byte>(bytes), Fanout::STAR, nullptr, true);
  expectAllHold(bytes, results);
  EXPECT_EQ(device->bytesIn, bytes.size());  // each byte copied in once
  // A few staging buffers carried every chunk: a ring's worth, not one per chunk.
  EXPECT_LE(device->stagingMade, actor_detail::StagingRing::buffersFor(64 << 10, 512 << 10));
  EXPECT_EQ(device->liveBytes, bytes.size());
  m.received.clear();
  EXPECT_EQ(device->liveBytes, 0u);  // the handler let go: nothing else holds the memory
}

TEST_F(BlobDeviceTest, ABlobSentFromDeviceMemoryReachesHostAndDeviceMembers) {
  add(nullptr);
  add(device);
  add(nullptr);
  auto bytes = pattern((1 << 20) + 8, 2);
  auto results = send(device->upload(loop.waitScope(), bytes), Fanout::STAR, device);
  expectAllHold(bytes, results);
  // Each of the three hops had every chunk copied out of the device for it (or shared one).
  EXPECT_GE(device->bytesOut, bytes.size());
}

TEST_F(BlobDeviceTest, AChainForwardsFromDeviceMemoryHopToHop) {
  add(device);
  add(nullptr);
  add(device);
  add(device);
  auto bytes = pattern((3 << 20) + 64, 3);
  auto results = send(device->upload(loop.waitScope(), bytes), Fanout::CHAIN, device);
  expectAllHold(bytes, results);
}

TEST_F(BlobDeviceTest, ATransferGivenUpMidwayFreesItsDeviceMemory) {
  auto firstChunk = kj::newPromiseAndFulfiller<void>();
  auto gaveUp = kj::newPromiseAndFulfiller<void>();
  BlobAcceptOptions options;
  options.onProgress = [&](const BlobHeader&, uint64_t) { firstChunk.fulfiller->fulfill(); };
  options.onGiveUp = [&](const BlobHeader&, const kj::Exception&) { gaveUp.fulfiller->fulfill(); };
  auto& m = add(device, kj::mv(options));
  auto bytes = pattern(8 << 20, 4);
  auto targets = KJ_MAP(x, members) { return BlobTarget{x->endpoint, x->address}; };
  {
    BlobSendOptions send{.chunkBytes = 64 << 10, .windowBytes = 128 << 10};
    auto transfer = sendBlob(loop, targets, "weights", 1, kj::heapArray<kj::byte>(bytes),
                             kj::mv(send));
    await(loop, kj::mv(firstChunk.promise));
  }  // the sender drops the transfer: the receiver is told to give up
  await(loop, kj::mv(gaveUp.promise));
  await(loop, device->whenAllFreed());  // once the copies in flight are done
  EXPECT_TRUE(m.received.empty());
}

TEST_F(BlobDeviceTest, OnOneHostAMemberCopiesFromTheSendersDeviceMemoryDirectly) {
  auto& m = add(device);
  auto bytes = pattern((2 << 20) + 8, 5);
  auto from = device->upload(loop.waitScope(), bytes);
  uint64_t uploaded = device->bytesIn;
  auto results = send(kj::mv(from), Fanout::STAR, device, true);
  expectAllHold(bytes, results);
  EXPECT_EQ(device->bytesWithin, bytes.size());  // every byte device to device, once
  EXPECT_EQ(device->bytesIn, uploaded);          // none through staging buffers
  EXPECT_EQ(device->stagingMade, 0u);
  EXPECT_EQ(results[0].pulledBytes, bytes.size());  // and the member says so
  m.received.clear();
  EXPECT_EQ(device->imports, 0u);  // the sender's memory is closed again
  EXPECT_EQ(device->liveBytes, 0u);
}

TEST_F(BlobDeviceTest, AChainOnOneHostCopiesDeviceToDeviceHopByHopAndThroughHostWhereItMust) {
  add(device);
  add(device);
  add(nullptr);  // host memory: its chunks are staged out of its parent's device memory
  add(device);   // copies from its parent, which has host memory: through staging again
  add(device);
  auto bytes = pattern((4 << 20) + 4096, 6);
  auto results = send(device->upload(loop.waitScope(), bytes), Fanout::CHAIN, device, true);
  expectAllHold(bytes, results);
  // Three hops device to device (into members 0, 1 and 4), as each says.
  EXPECT_EQ(device->bytesWithin, 3 * bytes.size());
  uint64_t pulled[] = {bytes.size(), bytes.size(), 0, 0, bytes.size()};
  for (size_t i = 0; i < results.size(); ++i) {
    EXPECT_EQ(results[i].pulledBytes, pulled[i]) << members[i]->endpoint;
  }
}

TEST_F(BlobDeviceTest, AMemberThatCannotOpenTheSendersMemoryTakesTheChunksThroughHostMemory) {
  auto other = std::make_shared<test::HostBlobDevice>(loop);
  other->shares = false;
  auto& m = add(other);
  auto bytes = pattern((1 << 20) + 8, 7);
  auto results = send(device->upload(loop.waitScope(), bytes), Fanout::STAR, device, true);
  ASSERT_EQ(results.size(), 1u);
  KJ_IF_MAYBE(e, results[0].error) {
    FAIL() << e->getDescription().cStr();
  }
  ASSERT_EQ(m.received.size(), 1u);
  auto back = other->read(loop.waitScope(), m.received[0].bytes.begin(), bytes.size());
  EXPECT_TRUE(back == bytes);
  EXPECT_EQ(device->bytesWithin, 0u);
  EXPECT_EQ(other->bytesIn, bytes.size());
  EXPECT_EQ(results[0].pulledBytes, 0u);
}

TEST_F(BlobDeviceTest, WhereTheSendersDeviceCannotExportItsMemoryTheChunksGoThroughHostMemory) {
  add(device);
  auto bytes = pattern((1 << 20) + 8, 9);
  auto from = device->upload(loop.waitScope(), bytes);
  uint64_t uploaded = device->bytesIn;
  device->exportFails = true;
  auto results = send(kj::mv(from), Fanout::STAR, device, true);
  expectAllHold(bytes, results);
  EXPECT_EQ(device->bytesWithin, 0u);
  EXPECT_EQ(device->bytesIn - uploaded, bytes.size());  // staged, and copied in
  EXPECT_EQ(results[0].pulledBytes, 0u);
}

TEST_F(BlobDeviceTest, AnEmptyBlobIsHandedOverAsAnyOther) {
  add(device);
  add(nullptr);
  auto results = send(device->upload(loop.waitScope(), {}), Fanout::STAR, device, true);
  expectAllHold({}, results);
}

TEST_F(BlobDeviceTest, ACopyIntoTheDeviceThatFailsGivesTheTransferUpAndFreesItsMemory) {
  auto gaveUp = kj::newPromiseAndFulfiller<void>();
  BlobAcceptOptions options;
  options.onGiveUp = [&](const BlobHeader&, const kj::Exception&) { gaveUp.fulfiller->fulfill(); };
  auto& m = add(device, kj::mv(options));
  device->failCopiesInPast = 1 << 20;
  auto bytes = pattern(4 << 20, 8);
  auto results = send(kj::heapArray<kj::byte>(bytes), Fanout::STAR, nullptr);
  ASSERT_EQ(results.size(), 1u);
  auto error = KJ_ASSERT_NONNULL(results[0].error).getDescription();
  EXPECT_NE(std::string(error.cStr()).find("the device failed a copy"), std::string::npos)
      << error.cStr();
  EXPECT_EQ(errorCode(KJ_ASSERT_NONNULL(results[0].error)), ErrorCode::BLOB_ABORTED);
  await(loop, kj::mv(gaveUp.promise));
  await(loop, device->whenAllFreed());
  EXPECT_TRUE(m.received.empty());
}

TEST_F(BlobDeviceTest, ATransferGivenUpWhileItWaitsForAStagingBufferLetsGoOfEverything) {
  auto staged = kj::newPromiseAndFulfiller<void>();
  auto gaveUp = kj::newPromiseAndFulfiller<void>();
  constexpr uint32_t CHUNK = 64 << 10;
  constexpr uint64_t WINDOW = 512 << 10;
  size_t ring = actor_detail::StagingRing::buffersFor(CHUNK, WINDOW);
  BlobAcceptOptions options;
  options.onProgress = [&](const BlobHeader&, uint64_t received) {
    if (received == ring * CHUNK) staged.fulfiller->fulfill();
  };
  options.onGiveUp = [&](const BlobHeader&, const kj::Exception&) { gaveUp.fulfiller->fulfill(); };
  auto& m = add(device, kj::mv(options));
  device->pause();  // the device copies nothing: every staging buffer stays taken
  auto targets = KJ_MAP(x, members) { return BlobTarget{x->endpoint, x->address}; };
  {
    BlobSendOptions send{.chunkBytes = CHUNK, .windowBytes = WINDOW};
    auto transfer = sendBlob(loop, targets, "weights", 1, kj::heapArray<kj::byte>(4 << 20),
                             kj::mv(send));
    await(loop, kj::mv(staged.promise));  // the ring is full; later chunks wait for a buffer
  }                                       // given up meanwhile
  await(loop, kj::mv(gaveUp.promise));
  device->resume();
  await(loop, device->whenAllFreed());
  EXPECT_TRUE(m.received.empty());
  EXPECT_LE(device->stagingMade, ring);
}

// --- A real GPU, where there is one ------------------------------------------------------------

TEST(CudaBlobTest, ABlobGoesIntoAndOutOfAGpu) {
  auto& info = cudaRuntime();
  if (!info.available) GTEST_SKIP() << "no GPU here: " << info.reason;
  EventLoop loop;
  auto gpu = cudaBlobDevice(loop, 0);
  JobContext job;
  job.jobId = "blobs";
  ActorServer server(loop, job);
  BlobAcceptOptions accept;
  accept.device = gpu;
  std::vector<Blob> received;
  server.acceptBlobs(
      "weights", [&](const BlobHeader& h) { return gpu->allocate(h.size); },
      [&](Blob b) { received.push_back(kj::mv(b)); }, kj::mv(accept));
  auto address = server.listen("tcp://127.0.0.1:0");
  auto bytes = pattern((64 << 20) + 8, 5);
  auto staged = gpu->allocate(bytes.size());
  gpu->copyIn(staged.begin(), bytes.begin(), bytes.size()).wait(loop.waitScope());
  BlobSendOptions send;
  send.device = gpu;
  BlobTarget targets[] = {{"blobs/gpu-0", address}};
  auto transfer = sendBlob(loop, targets, "weights", 1, kj::mv(staged), kj::mv(send));
  auto results = await(loop, transfer.waitAll(60 * kj::SECONDS));
  ASSERT_TRUE(results[0].ok()) << KJ_ASSERT_NONNULL(results[0].error).getDescription().cStr();
  ASSERT_EQ(received.size(), 1u);
  auto back = kj::heapArray<kj::byte>(bytes.size());
  gpu->copyOut(back.begin(), received[0].bytes.begin(), back.size()).wait(loop.waitScope());
  EXPECT_TRUE(back == bytes);
}

}  // namespace
}  // namespace troupe
