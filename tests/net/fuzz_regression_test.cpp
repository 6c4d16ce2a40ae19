// Inputs the fuzz targets (fuzz/) found to crash something, fed through the public API: each
// now gets a clean error, and the server goes on serving.

#include <string.h>

#include <cstdint>

#include <gtest/gtest.h>

#include "tests/support/server_fixture.h"

namespace troupe {
namespace {

using test::Echo;
using test::ScientificCalculator;

class FuzzRegressionTest : public test::ServerFixture {
protected:
  // The actor's error for `call`, which must fail.
  template <typename Fn>
  kj::Exception failure(Fn&& call) {
    auto calc = ref<ScientificCalculator>("calc");
    KJ_IF_MAYBE(e, kj::runCatchingExceptions([&]() { calc.call(call).wait(ws()); })) {
      return kj::mv(*e);
    }
    ADD_FAILURE() << "the call succeeded";
    return KJ_EXCEPTION(FAILED, "the call succeeded");
  }
};

// actor_server_fuzz: an add whose sum does not fit an Int64 was undefined behaviour in the test
// calculator (UBSan: signed integer overflow).
TEST_F(FuzzRegressionTest, AnAddThatOverflowsFailsInTheActor) {
  auto e = failure([](ScientificCalculator::Client c) {
    auto q = c.addRequest();
    q.setA(INT64_MAX);
    q.setB(1);
    return q.send();
  });
  EXPECT_EQ(errorCode(e), ErrorCode::FAILED) << e.getDescription().cStr();
  EXPECT_TRUE(raisedByActor(e));
  EXPECT_TRUE(strstr(e.getDescription().cStr(), "overflows") != nullptr)
      << e.getDescription().cStr();
  expectServing();
}

// actor_server_fuzz: INT64_MIN / -1 trapped (SIGFPE), killing the server that hosted the test
// calculator.
TEST_F(FuzzRegressionTest, ADivisionThatOverflowsFailsInTheActor) {
  auto e = failure([](ScientificCalculator::Client c) {
    auto q = c.divideRequest();
    q.setA(INT64_MIN);
    q.setB(-1);
    return q.send();
  });
  EXPECT_EQ(errorCode(e), ErrorCode::FAILED) << e.getDescription().cStr();
  EXPECT_TRUE(raisedByActor(e));
  EXPECT_TRUE(strstr(e.getDescription().cStr(), "overflows") != nullptr)
      << e.getDescription().cStr();
  expectServing();
}

}  // namespace
}  // namespace troupe
