// MetricsHistory: the dashboard's samples taken from what endpoints' /metrics add up to.

#include "troupe/resolver/detail/metrics_history.h"

#include <gtest/gtest.h>

#include "troupe/base/errors.h"

namespace troupe::resolver_detail {
namespace {

// What a server's /metrics says of actor `actor` of job `job`: `ok` calls that took 1 ms and
// `failed` DEADLINE_EXCEEDED ones that took 1 s, all to method "m".
MetricsSnapshot served(const char* job, const char* actor, uint64_t ok, uint64_t failed) {
  MetricsSnapshot m;
  MetricLabels labels = {{"job", job}, {"actor", actor}, {"method", "m"}};
  auto withCode = [&](const char* code, uint64_t n) {
    auto l = labels;
    l.emplace_back("code", code);
    m.add("troupe_calls_total", "", MetricType::COUNTER, l, static_cast<double>(n));
  };
  withCode("ok", ok);
  if (failed > 0) withCode("deadline_exceeded", failed);
  LatencyHistogram latency;
  for (uint64_t i = 0; i < ok; ++i) latency.record(1 * kj::MILLISECONDS);
  for (uint64_t i = 0; i < failed; ++i) latency.record(1 * kj::SECONDS);
  m.addHistogram("troupe_call_duration_seconds", "", labels, latency);
  // Another actor's calls in the same server are not this one's.
  m.add("troupe_calls_total", "", MetricType::COUNTER,
        {{"job", job}, {"actor", "other"}, {"method", "m"}, {"code", "ok"}}, 1000);
  return m;
}

TEST(MetricsHistoryTest, CallTotalsAreThoseOfTheEndpointsJobAndActor) {
  auto totals = callTotals(served("j", "a", 7, 2), "j", "a");
  EXPECT_EQ(totals.outcomes.ok, 7u);
  EXPECT_EQ(totals.outcomes.error(ErrorCode::DEADLINE_EXCEEDED), 2u);
  EXPECT_EQ(totals.outcomes.total(), 9u);
  EXPECT_EQ(totals.latency.count, 9u);
  EXPECT_EQ(callTotals(served("j", "a", 7, 2), "k", "a").outcomes.total(), 0u);
}

TEST(MetricsHistoryTest, SamplesAreRatesAndQuantilesOfEachIntervalAndJobsAddTheirEndpoints) {
  MetricsHistory history({.interval = 5 * kj::SECONDS, .length = 60 * kj::SECONDS});
  history.beginRound(1000);
  history.add("j/a-0", "j", callTotals(served("j", "a", 100, 0), "j", "a"));
  history.add("j/a-1", "j", callTotals(served("j", "a", 0, 0), "j", "a"));
  history.endRound();
  // The first read is where differences start from: no sample yet.
  EXPECT_TRUE(history.endpoint("j/a-0")->samples().empty());
  EXPECT_TRUE(history.job("j")->samples().empty());

  history.beginRound(6000);  // 5 s later
  history.add("j/a-0", "j", callTotals(served("j", "a", 150, 5), "j", "a"));
  history.add("j/a-1", "j", callTotals(served("j", "a", 25, 0), "j", "a"));
  history.endRound();

  auto a0 = history.endpoint("j/a-0")->samples();
  ASSERT_EQ(a0.size(), 1u);
  EXPECT_EQ(a0[0].atMillis, 6000);
  EXPECT_FLOAT_EQ(a0[0].calls, 11.0f);  // 55 calls in 5 s
  EXPECT_FLOAT_EQ(a0[0].errors, 1.0f);
  EXPECT_EQ(a0[0].byCode[0].first, static_cast<uint8_t>(ErrorCode::DEADLINE_EXCEEDED));
  EXPECT_FLOAT_EQ(a0[0].byCode[0].second, 1.0f);
  EXPECT_EQ(a0[0].byCode[1].first, MetricsHistory::NO_CODE);
  // 50 calls of 1 ms and 5 of 1 s: the median in the 1 ms bucket, p99 in the 1 s one.
  EXPECT_GT(a0[0].p50, 0.0005f);
  EXPECT_LE(a0[0].p50, 0.001f);
  EXPECT_GT(a0[0].p99, 0.5f);
  EXPECT_LE(a0[0].p99, 1.0f);

  auto job = history.job("j")->samples();
  ASSERT_EQ(job.size(), 1u);
  EXPECT_FLOAT_EQ(job[0].calls, 16.0f);  // 11 + 5
  EXPECT_FLOAT_EQ(job[0].errors, 1.0f);
  EXPECT_GT(job[0].p99, 0.5f);
}

TEST(MetricsHistoryTest, ARestartedServerStartsItsDifferencesAgain) {
  MetricsHistory history({.interval = 1 * kj::SECONDS, .length = 60 * kj::SECONDS});
  auto round = [&](int64_t at, uint64_t ok) {
    history.beginRound(at);
    history.add("j/a-0", "j", callTotals(served("j", "a", ok, 0), "j", "a"));
    history.endRound();
  };
  round(1000, 500);
  round(2000, 600);
  round(3000, 10);  // the counters went down: the server restarted
  round(4000, 30);
  auto s = history.endpoint("j/a-0")->samples();
  ASSERT_EQ(s.size(), 2u);
  EXPECT_FLOAT_EQ(s[0].calls, 100.0f);
  EXPECT_EQ(s[1].atMillis, 4000);
  EXPECT_FLOAT_EQ(s[1].calls, 20.0f);
}

TEST(MetricsHistoryTest, ItKeepsItsLengthForgetsWhatIsNotReadAndBoundsItsSeries) {
  // 6 samples per series; at most 4 series.
  MetricsHistory history({.interval = 5 * kj::SECONDS, .length = 30 * kj::SECONDS, .maxSeries = 4});
  for (int64_t r = 0; r < 10; ++r) {
    history.beginRound(r * 5000);
    history.add("j/a-0", "j",
                callTotals(served("j", "a", static_cast<uint64_t>(r * 5), 0), "j", "a"));
    if (r < 2) history.add("k/b-0", "k", callTotals(served("k", "b", 0, 0), "k", "b"));
    if (r == 1) history.add("k/c-0", "k", callTotals(served("k", "c", 0, 0), "k", "c"));
    history.endRound();
    if (r == 1) {
      // j/a-0, k/b-0 and their jobs took the four places: k/c-0 got none.
      EXPECT_EQ(history.seriesCount(), 4u);
      EXPECT_NE(history.job("k"), nullptr);
      EXPECT_EQ(history.endpoint("k/c-0"), nullptr);
      EXPECT_EQ(history.refused(), 1u);
    }
  }
  auto s = history.endpoint("j/a-0")->samples();
  ASSERT_EQ(s.size(), 6u);  // the last 30 s
  EXPECT_EQ(s.front().atMillis, 20000);
  EXPECT_EQ(s.back().atMillis, 45000);
  for (auto& sample : s) EXPECT_FLOAT_EQ(sample.calls, 1.0f);
  // k/b-0 was last read in round 2 of 10: more than 30 s ago, so it is gone, and its job.
  EXPECT_EQ(history.endpoint("k/b-0"), nullptr);
  EXPECT_EQ(history.job("k"), nullptr);
  EXPECT_EQ(history.seriesCount(), 2u);
  EXPECT_GT(history.memoryBytes(), 2 * 6 * sizeof(MetricsHistory::Sample));
  EXPECT_EQ(sizeof(MetricsHistory::Sample), 48u);
}

}  // namespace
}  // namespace troupe::resolver_detail
