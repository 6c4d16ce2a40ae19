// Large messages: their memory is reused from one message to the next, which must never show
// one message's bytes in another, nor change a message its holder still reads.

#include <thread>

#include <capnp/message.h>
#include <gtest/gtest.h>
#include <kj/vector.h>

#include "troupe/base/buffer_cache.h"
#include "troupe/net/bytes.h"
#include "tests/support/manual_clock.h"
#include "tests/support/server_fixture.h"

namespace troupe {
namespace {

using test::Echo;

constexpr size_t MiB = size_t{1} << 20;

// The byte a payload tagged `tag` holds at `i`.
kj::byte patternAt(size_t i, uint8_t tag) { return static_cast<kj::byte>((i * 131 + tag) & 0xff); }

// An owned array of `size` bytes set from `tag`, starting `offset` bytes into its allocation;
// `*freed` becomes true when it is dropped.
kj::Array<const kj::byte> patternBytes(size_t size, uint8_t tag, size_t offset, bool* freed) {
  auto storage = kj::heapArray<kj::byte>(size + offset);
  for (size_t i = 0; i < size; ++i) storage[offset + i] = patternAt(i, tag);
  kj::ArrayPtr<const kj::byte> view = storage.slice(offset, offset + size);
  return view.attach(kj::mv(storage), kj::defer([freed]() { *freed = true; }));
}

// Echo whose results point at a copy it owns, made with adoptBytes().
class AdoptingEcho final : public Echo::Server {
public:
  bool lastAdopted = false;

protected:
  kj::Promise<void> echo(EchoContext context) override {
    auto in = context.getParams().getPayload();
    auto copy = kj::heapArray<const kj::byte>(in.begin(), in.size());
    context.releaseParams();
    auto results = context.getResults();
    lastAdopted = adoptBytes(results, &Echo::EchoResults::Builder::adoptPayload, kj::mv(copy));
    return kj::READY_NOW;
  }
};

// On a manual clock: the buffer cache gives memory back only when the test moves time on.
class LargeMessageTest : public test::ServerFixture {
protected:
  LargeMessageTest() : ServerFixture({.manualClock = true}) {}

  // An echo of `size` bytes, every byte set from `tag`.
  kj::Promise<capnp::Response<Echo::EchoResults>> echoPattern(ActorRef<Echo>& echo, size_t size,
                                                              uint8_t tag) {
    return echo.call([size, tag](Echo::Client c) {
      auto q = c.echoRequest(capnp::MessageSize{size / sizeof(capnp::word) + 16, 0});
      auto data = q.initPayload(size);
      for (size_t i = 0; i < size; ++i) data[i] = patternAt(i, tag);
      return q.send();
    });
  }

  // The index of the first byte of `data` that differs from the pattern, or data.size().
  static size_t firstMismatch(capnp::Data::Reader data, uint8_t tag) {
    for (size_t i = 0; i < data.size(); ++i) {
      if (data[i] != patternAt(i, tag)) return i;
    }
    return data.size();
  }
};

TEST_F(LargeMessageTest, AdoptedRequestBytesAreSentWithoutACopyAndFreedAfterTheSend) {
  auto echo = ref<Echo>("echo");
  // Until the connection is up and the actor found, a request is queued in this process (and
  // adoptBytes copies); once it is, requests are built in the message that goes on the wire.
  echoPattern(echo, 64, 1).wait(ws());
  for (size_t size : {size_t{64}, 4 * MiB}) {
    bool freed = false, adopted = false;
    auto r = echo.call([&](Echo::Client c) {
                   auto q = c.echoRequest();
                   adopted = adoptBytes(q, &Echo::EchoParams::Builder::adoptPayload,
                                        patternBytes(size, 9, 0, &freed));
                   return q.send();
                 })
                 .wait(ws());
    EXPECT_TRUE(adopted) << size;
    ASSERT_EQ(r.getPayload().size(), size);
    EXPECT_EQ(firstMismatch(r.getPayload(), 9), size);
    // The request message, and the bytes with it, go once it has been written.
    EXPECT_TRUE(pollUntil([&]() { return freed; })) << size;
  }
}

TEST_F(LargeMessageTest, BytesThatCannotBeReferencedAreCopiedAndFreedAtOnce) {
  auto echo = ref<Echo>("echo");
  struct Case {
    size_t size, offset;
  };
  // Not a multiple of 8; not on an 8-byte boundary; empty.
  for (auto c : {Case{MiB + 3, 0}, Case{MiB, 4}, Case{0, 0}}) {
    bool freed = false, adopted = true;
    auto r = echo.call([&](Echo::Client client) {
                   auto q = client.echoRequest();
                   adopted = adoptBytes(q, &Echo::EchoParams::Builder::adoptPayload,
                                        patternBytes(c.size, 10, c.offset, &freed));
                   EXPECT_TRUE(freed);
                   return q.send();
                 })
                 .wait(ws());
    EXPECT_FALSE(adopted);
    ASSERT_EQ(r.getPayload().size(), c.size);
    EXPECT_EQ(firstMismatch(r.getPayload(), 10), c.size);
  }
  // A message troupe does not send: copied.
  capnp::MallocMessageBuilder own;
  auto root = own.initRoot<Echo::EchoParams>();
  bool freed = false;
  EXPECT_FALSE(adoptBytes(root, &Echo::EchoParams::Builder::adoptPayload,
                          patternBytes(4096, 11, 0, &freed)));
  EXPECT_TRUE(freed);
  EXPECT_EQ(firstMismatch(root.asReader().getPayload(), 11), 4096u);
}

TEST_F(LargeMessageTest, AnActorCanAnswerWithAdoptedBytes) {
  auto impl = kj::heap<AdoptingEcho>();
  auto& adopting = *impl;
  server->host<Echo>("adopting", kj::mv(impl));
  auto echo = ref<Echo>("adopting");
  for (uint8_t tag = 20; tag < 23; ++tag) {
    auto r = echoPattern(echo, 3 * MiB, tag).wait(ws());
    EXPECT_TRUE(adopting.lastAdopted);
    EXPECT_EQ(firstMismatch(r.getPayload(), tag), 3 * MiB);
  }
}

TEST_F(LargeMessageTest, AMessageBuiltInReusedMemoryStartsZeroed) {
  auto echo = ref<Echo>("echo");
  // Fill the memory that the next messages of this size will reuse...
  for (uint8_t tag = 1; tag <= 3; ++tag) {
    auto r = echoPattern(echo, 4 * MiB, tag).wait(ws());
    ASSERT_EQ(firstMismatch(r.getPayload(), tag), 4 * MiB);
  }
  // ... then send a payload whose bytes are never written: it must arrive, and come back, as
  // zeros, not as what the reused memory held.
  auto r = echo.call([](Echo::Client c) {
                 auto q = c.echoRequest(capnp::MessageSize{4 * MiB / sizeof(capnp::word) + 16, 0});
                 q.initPayload(4 * MiB);
                 return q.send();
               })
               .wait(ws());
  auto data = r.getPayload();
  ASSERT_EQ(data.size(), 4 * MiB);
  size_t nonZero = 0;
  for (auto b : data) nonZero += b != 0;
  EXPECT_EQ(nonZero, 0u);
}

TEST_F(LargeMessageTest, ResponsesStillHeldKeepTheirBytesWhileLaterCallsReuseMemory) {
  auto echo = ref<Echo>("echo");
  // Hold more large responses than the cache keeps buffers, each while later ones arrive.
  kj::Vector<capnp::Response<Echo::EchoResults>> held;
  for (uint8_t tag = 0; tag < BUFFER_CACHE_MAX_BUFFERS + 2; ++tag) {
    held.add(echoPattern(echo, 2 * MiB, tag).wait(ws()));
  }
  for (uint8_t tag = 0; tag < held.size(); ++tag) {
    EXPECT_EQ(firstMismatch(held[tag].getPayload(), tag), 2 * MiB) << "response " << int(tag);
  }
  // Drop them in an order unlike the one they came in, then go on: every call sees its own bytes.
  for (size_t i = 0; i < held.size(); i += 2) held[i] = echoPattern(echo, 64, 200).wait(ws());
  for (uint8_t tag = 50; tag < 56; ++tag) {
    auto r = echoPattern(echo, 2 * MiB, tag).wait(ws());
    EXPECT_EQ(firstMismatch(r.getPayload(), tag), 2 * MiB) << "tag " << int(tag);
  }
  for (size_t i = 1; i < held.size(); i += 2) {
    EXPECT_EQ(firstMismatch(held[i].getPayload(), static_cast<uint8_t>(i)), 2 * MiB);
  }
}

TEST_F(LargeMessageTest, SizesThatGrowAndShrinkEachArriveWhole) {
  auto echo = ref<Echo>("echo");
  const size_t sizes[] = {3 * MiB, 1 * MiB, 5 * MiB + 3, 100 * 1024, 5 * MiB, 2 * MiB + 1, 64};
  uint8_t tag = 0;
  for (size_t size : sizes) {
    auto r = echoPattern(echo, size, ++tag).wait(ws());
    ASSERT_EQ(r.getPayload().size(), size);
    EXPECT_EQ(firstMismatch(r.getPayload(), tag), size) << size << " bytes";
  }
}

TEST_F(LargeMessageTest, CallsInFlightTogetherEachGetTheirOwnBytes) {
  auto echo = ref<Echo>("echo");
  kj::Vector<kj::Promise<capnp::Response<Echo::EchoResults>>> calls;
  for (uint8_t tag = 0; tag < 8; ++tag) calls.add(echoPattern(echo, MiB + tag * 4096, tag));
  for (uint8_t tag = 0; tag < 8; ++tag) {
    auto r = calls[tag].wait(ws());
    ASSERT_EQ(r.getPayload().size(), MiB + tag * 4096);
    EXPECT_EQ(firstMismatch(r.getPayload(), tag), r.getPayload().size()) << "call " << int(tag);
  }
}

TEST_F(LargeMessageTest, TheCacheStaysWithinItsBounds) {
  auto echo = ref<Echo>("echo");
  for (uint8_t tag = 0; tag < 6; ++tag) {
    auto r = echoPattern(echo, (tag + 1) * 8 * MiB, tag).wait(ws());
    ASSERT_EQ(r.getPayload().size(), (tag + 1) * 8 * MiB);
  }
  EXPECT_LE(cachedMessageBuffers(), BUFFER_CACHE_MAX_BUFFERS);
  EXPECT_LE(cachedMessageBufferBytes(), BUFFER_CACHE_MAX_BYTES);
  // Something was kept for the next large message.
  EXPECT_GT(cachedMessageBufferBytes(), 8 * MiB);
}

TEST_F(LargeMessageTest, BuffersNoLongerReusedAreGivenBack) {
  auto echo = ref<Echo>("echo");
  auto r = echoPattern(echo, 16 * MiB, 7).wait(ws());
  ASSERT_EQ(firstMismatch(r.getPayload(), 7), 16 * MiB);
  r = echoPattern(echo, 64, 8).wait(ws());
  auto cachedBytes = cachedMessageBufferBytes();
  auto cachedBuffers = cachedMessageBuffers();
  ASSERT_GT(cachedBytes, 0u);
  // Kept while they have waited no longer than BUFFER_CACHE_IDLE_SECONDS of the loop's time...
  constexpr auto& INTERVAL = BUFFER_CACHE_TRIM_INTERVAL;
  test::advanceInSteps(loop, BUFFER_CACHE_IDLE_SECONDS * kj::SECONDS, INTERVAL);
  EXPECT_EQ(cachedMessageBufferBytes(), cachedBytes);
  EXPECT_EQ(cachedMessageBuffers(), cachedBuffers);
  // ...and given back by the trim one interval later.
  test::advanceInSteps(loop, INTERVAL, INTERVAL);
  EXPECT_EQ(cachedMessageBufferBytes(), 0u);
  EXPECT_EQ(cachedMessageBuffers(), 0u);
}

TEST_F(LargeMessageTest, AReceivedPayloadIsKeptPastItsMessageWithoutACopy) {
  auto echo = ref<Echo>("echo");
  kj::Array<kj::byte> kept, moreOfIt;
  {
    auto r = echoPattern(echo, 4 * MiB, 9).wait(ws());
    auto payload = r.getPayload();
    kept = KJ_ASSERT_NONNULL(keepReceivedBytes(payload));
    EXPECT_EQ(kept.begin(), payload.begin());  // the message's own memory, not a copy
    EXPECT_EQ(kept.size(), 4 * MiB);
    moreOfIt = KJ_ASSERT_NONNULL(keepReceivedBytes(payload.slice(MiB, 2 * MiB)));
    EXPECT_EQ(moreOfIt.begin(), payload.begin() + MiB);
  }

  // The response is gone; what was kept stays, and the next large messages (the request the
  // server reads, the response read here) get memory other than it, though the cache is free
  // to reuse everything else.
  auto r = echoPattern(echo, 4 * MiB, 10).wait(ws());
  EXPECT_NE(r.getPayload().begin(), kept.begin());
  EXPECT_EQ(firstMismatch(r.getPayload(), 10), 4 * MiB);
  EXPECT_EQ(firstMismatch(kept, 9), 4 * MiB);
  EXPECT_EQ(firstMismatch(moreOfIt, 9), MiB);

  // Let go of on the loop's thread, the memory goes back to its cache for the next message.
  auto buffersBefore = cachedMessageBuffers();
  kept = nullptr;
  moreOfIt = nullptr;
  EXPECT_EQ(cachedMessageBuffers(), buffersBefore + 1);
}

TEST_F(LargeMessageTest, OnlyLargeReceivedMessagesAreKept) {
  auto echo = ref<Echo>("echo");
  auto small = echoPattern(echo, 1024, 1).wait(ws());
  EXPECT_TRUE(keepReceivedBytes(small.getPayload()) == nullptr);

  capnp::MallocMessageBuilder built;
  auto local = built.initRoot<Echo::EchoParams>().initPayload(MiB);
  EXPECT_TRUE(keepReceivedBytes(local) == nullptr);
  EXPECT_TRUE(keepReceivedBytes(kj::ArrayPtr<const kj::byte>()) == nullptr);
}

TEST_F(LargeMessageTest, KeptBytesLetGoOfOnAThreadWithoutALoopAreGivenBack) {
  auto echo = ref<Echo>("echo");
  auto kept = KJ_ASSERT_NONNULL(
      keepReceivedBytes(echoPattern(echo, 8 * MiB, 3).wait(ws()).getPayload()));
  size_t cachedThere = 1;
  std::thread([&]() {
    EXPECT_EQ(firstMismatch(kept, 3), 8 * MiB);
    kept = nullptr;  // the last holder: the memory goes now, not into a cache no loop trims
    cachedThere = cachedMessageBuffers();
  }).join();
  EXPECT_EQ(cachedThere, 0u);
}

}  // namespace
}  // namespace troupe
