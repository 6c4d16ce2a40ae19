// Backoff: exponential ceilings with a cap, jitter between half and all of the ceiling, and the
// same waits from the same seed.

#include "troupe/base/backoff.h"

#include <gtest/gtest.h>
#include <kj/vector.h>

#include "troupe/base/errors.h"
#include "troupe/base/event_loop.h"

namespace troupe {
namespace {

TEST(BackoffTest, CeilingsDoubleUpToTheCap) {
  Backoff backoff(10 * kj::MILLISECONDS, 75 * kj::MILLISECONDS);
  EXPECT_EQ(backoff.ceiling(0), 10 * kj::MILLISECONDS);
  EXPECT_EQ(backoff.ceiling(1), 20 * kj::MILLISECONDS);
  EXPECT_EQ(backoff.ceiling(2), 40 * kj::MILLISECONDS);
  EXPECT_EQ(backoff.ceiling(3), 75 * kj::MILLISECONDS);
  EXPECT_EQ(backoff.ceiling(1000), 75 * kj::MILLISECONDS);
}

TEST(BackoffTest, EachWaitLiesBetweenHalfAndAllOfItsCeiling) {
  Backoff backoff(8 * kj::MILLISECONDS, 1 * kj::SECONDS);
  Random random(1);
  for (uint32_t attempt = 0; attempt < 12; ++attempt) {
    for (int i = 0; i < 50; ++i) {
      auto wait = backoff.delay(attempt, random);
      EXPECT_GE(wait, backoff.ceiling(attempt) / 2) << attempt;
      EXPECT_LE(wait, backoff.ceiling(attempt)) << attempt;
    }
  }
}

TEST(BackoffTest, TheLoopsSeedRepeatsTheWaits) {
  Backoff backoff(10 * kj::MILLISECONDS, 1 * kj::SECONDS);
  auto waits = [&](uint64_t seed) {
    EventLoop loop({.randomSeed = seed});
    kj::Vector<int64_t> out;
    for (uint32_t i = 0; i < 8; ++i) out.add(backoff.delay(i, loop.random()) / kj::NANOSECONDS);
    return out.releaseAsArray();
  };
  auto a = waits(42);
  auto b = waits(42);
  auto c = waits(43);
  EXPECT_TRUE(a == b);
  EXPECT_FALSE(a == c);
}

TEST(BackoffTest, ABadRangeIsRefusedNamingIt) {
  for (auto initial : {0 * kj::SECONDS, 2 * kj::SECONDS}) {
    KJ_IF_MAYBE(e, kj::runCatchingExceptions([&]() {
                  Backoff(initial, 1 * kj::SECONDS, "FooOptions' retryMin and retryMax");
                })) {
      EXPECT_EQ(errorCode(*e), ErrorCode::INVALID_ARGUMENT);
      EXPECT_TRUE(kj::StringPtr(e->getDescription())
                      .startsWith("troupe.invalid_argument: FooOptions' retryMin and retryMax need "
                                  "0 < initial <= max"))
          << e->getDescription().cStr();
    } else {
      ADD_FAILURE() << "accepted " << (initial / kj::SECONDS) << " s";
    }
  }
}

}  // namespace
}  // namespace troupe
