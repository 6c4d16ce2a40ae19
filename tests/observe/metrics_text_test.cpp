// parsePrometheusText: what toPrometheusText() writes reads back the same; other exporters' text
// reads within what a snapshot holds; bad text is refused with its line, and kept within bounds.

#include "troupe/observe/metrics_text.h"

#include <cmath>
#include <string>

#include <gtest/gtest.h>

#include "tests/support/calculator_calls.h"
#include "tests/support/registry_helpers.h"
#include "tests/support/server_fixture.h"

namespace troupe::test {
namespace {

// Values pass through text with 9 significant digits; everything else must be exact.
void expectSameSnapshot(const MetricsSnapshot& expected, const MetricsSnapshot& actual) {
  ASSERT_EQ(expected.families().size(), actual.families().size());
  for (auto& [name, family] : expected.families()) {
    auto other = actual.family(name);
    ASSERT_NE(other, nullptr) << name;
    EXPECT_EQ(other->help, family.help) << name;
    EXPECT_EQ(other->type, family.type) << name;
    ASSERT_EQ(other->samples.size(), family.samples.size()) << name;
    for (size_t i = 0; i < family.samples.size(); ++i) {
      auto& a = family.samples[i];
      auto& b = other->samples[i];
      EXPECT_EQ(b.labels, a.labels) << name;
      EXPECT_NEAR(b.value, a.value, std::fabs(a.value) * 1e-8) << name;
      EXPECT_EQ(b.histogram.counts, a.histogram.counts) << name;
      EXPECT_EQ(b.histogram.count, a.histogram.count) << name;
      EXPECT_EQ(b.histogram.sumNanos, a.histogram.sumNanos) << name;
    }
  }
}

Failure refusalOf(kj::StringPtr text, const PrometheusTextLimits& limits = {}) {
  return thrownBy([&]() { parsePrometheusText(text, limits); });
}

using MetricsTextServerTest = ServerFixture;

TEST_F(MetricsTextServerTest, ARealServersSnapshotReadsBackTheSame) {
  auto calc = ref<Calculator>("calc");
  EXPECT_EQ(await(loop, add(calc, 1, 2)), 3);
  EXPECT_EQ(await(loop, add(calc, 3, 4)), 7);
  EXPECT_EQ(awaitError(loop, divide(calc, 1, 0)).code, ErrorCode::FAILED);
  expectServing();

  auto m = server->metrics();
  auto text = m.toPrometheusText();
  auto parsed = parsePrometheusText(text);
  expectSameSnapshot(m, parsed);
  EXPECT_EQ(parsed.toPrometheusText(), text);

  MetricLabels add = {{"job", "job-1"}, {"actor", "calc"}, {"method", "add"}};
  EXPECT_EQ(parsed.family("troupe_calls_started_total")->type, MetricType::COUNTER);
  EXPECT_EQ(parsed.family("troupe_call_duration_seconds")->type, MetricType::HISTOGRAM);
  EXPECT_EQ(parsed.value("troupe_calls_started_total", add), 2);
  EXPECT_EQ(parsed.sum("troupe_calls_total", {{"actor", "calc"}, {"code", "failed"}}), 1);
  EXPECT_EQ(parsed.histogram("troupe_call_duration_seconds", add).count, 2u);
  EXPECT_GT(parsed.histogram("troupe_call_duration_seconds", add).quantileSeconds(0.5), 0);
}

TEST(MetricsTextTest, HistogramsAreReassembledFromCumulativeBuckets) {
  MetricsSnapshot m;
  LatencyHistogram h;
  h.record(3 * kj::MICROSECONDS);
  h.record(30 * kj::MILLISECONDS);
  h.record(30 * kj::MILLISECONDS);
  h.record(2 * kj::SECONDS);
  h.record(90 * kj::SECONDS);
  m.addHistogram("troupe_x_seconds", "latency", {{"job", "j"}}, h);
  m.addHistogram("troupe_x_seconds", "latency", {{"job", "k"}}, {});
  auto parsed = parsePrometheusText(m.toPrometheusText());
  expectSameSnapshot(m, parsed);
  auto back = parsed.histogram("troupe_x_seconds", {{"job", "j"}});
  EXPECT_EQ(back.counts[0], 1u);
  EXPECT_EQ(back.counts[12], 2u);
  EXPECT_EQ(back.counts[17], 1u);
  EXPECT_EQ(back.counts.back(), 1u);
  EXPECT_EQ(back.sumNanos, h.sumNanos);
  EXPECT_EQ(parsed.histogram("troupe_x_seconds", {{"job", "k"}}).count, 0u);
}

TEST(MetricsTextTest, OtherBoundsGoToTheNearestTroupeBucketAtOrAboveThem) {
  auto parsed = parsePrometheusText(
      "# TYPE rpc_seconds histogram\n"
      "rpc_seconds_bucket{le=\"0.003\"} 1\n"   // into (2.5 ms, 5 ms]
      "rpc_seconds_bucket{le=\"0.005\"} 3\n"   // exactly 5 ms
      "rpc_seconds_bucket{le=\"1.0e-1\"} 4\n"  // 100 ms, written otherwise
      "rpc_seconds_bucket{le=\"120\"} 6\n"     // past 60 s: +Inf
      "rpc_seconds_bucket{le=\"+Inf\"} 7\n"
      "rpc_seconds_sum 130.5\n"
      "rpc_seconds_count 7\n");
  auto h = parsed.histogram("rpc_seconds");
  EXPECT_EQ(h.count, 7u);
  EXPECT_EQ(h.counts[9], 3u);   // 5 ms
  EXPECT_EQ(h.counts[13], 1u);  // 100 ms
  EXPECT_EQ(h.counts.back(), 3u);
  EXPECT_EQ(h.sumNanos, 130'500'000'000);
  uint64_t total = 0;
  for (auto c : h.counts) total += c;
  EXPECT_EQ(total, h.count);

  // Without +Inf or _count, the largest bucket is the count; with _count alone, what lies past
  // the last bound is in +Inf.
  EXPECT_EQ(parsePrometheusText("# TYPE a histogram\na_bucket{le=\"1\"} 4\n").histogram("a").count,
            4u);
  auto counted = parsePrometheusText("# TYPE a histogram\na_bucket{le=\"1\"} 4\na_count 9\n");
  EXPECT_EQ(counted.histogram("a").counts[16], 4u);
  EXPECT_EQ(counted.histogram("a").counts.back(), 5u);
}

TEST(MetricsTextTest, EscapesAreUndone) {
  MetricsSnapshot m;
  m.add("troupe_z", "help with \\ and\nnewline", MetricType::GAUGE,
        {{"member", "a\"b\\c\nd"}, {"empty", ""}, {"bytes", std::string("\x01\xff", 2)}}, 1.5);
  auto text = m.toPrometheusText();
  auto parsed = parsePrometheusText(text);
  expectSameSnapshot(m, parsed);
  EXPECT_EQ(parsed.family("troupe_z")->help, "help with \\ and\nnewline");
  EXPECT_EQ(parsed.family("troupe_z")->samples[0].labels[0].second, "a\"b\\c\nd");
  EXPECT_EQ(parsed.toPrometheusText(), text);
}

TEST(MetricsTextTest, NulBytesAndCarriageReturnsInHelpTextSurviveARoundTrip) {
  // Found by the fuzzer: a HELP text cut at its first NUL kept a '\r' that the next parse
  // dropped as part of a "\r\n" line end.
  std::string text = "# HELP troupe_x_total refused th\r";
  text.push_back('\0');
  text += "\n# TYPE troupe_x_total counter\ntroupe_x_total 1\n";
  auto once = parsePrometheusText(kj::StringPtr(text.c_str(), text.size())).toPrometheusText();
  auto twice = parsePrometheusText(kj::StringPtr(once.c_str(), once.size())).toPrometheusText();
  EXPECT_EQ(once, twice);
  auto parsed = parsePrometheusText(kj::StringPtr(once.c_str(), once.size()));
  ASSERT_NE(parsed.family("troupe_x_total"), nullptr);
  EXPECT_EQ(parsed.family("troupe_x_total")->help.size(), strlen("refused th\r") + 1);
}

TEST(MetricsTextTest, ValuesReadBackExactlyAsTheyWerePrinted) {
  // Found by the fuzzer: nine significant digits turned 666666666666.666... into 6.66666667e+11,
  // which read back as another number and printed differently.
  std::string text = "troupe_x 666666666666.666666666666666666666666660\ntroupe_y 0.1\n";
  auto once = parsePrometheusText(kj::StringPtr(text.c_str(), text.size()));
  EXPECT_EQ(once.value("troupe_x"), 666666666666.6666);
  auto printed = once.toPrometheusText();
  auto twice = parsePrometheusText(kj::StringPtr(printed.c_str(), printed.size()));
  EXPECT_EQ(twice.value("troupe_x"), once.value("troupe_x"));
  EXPECT_EQ(twice.toPrometheusText(), printed);
  EXPECT_NE(printed.find("troupe_y 0.1\n"), std::string::npos) << printed;
}

TEST(MetricsTextTest, OtherExportersTextReadsAsGauges) {
  auto parsed = parsePrometheusText("# A comment, and an unknown keyword:\n"
                                    "# UNIT go_info seconds\n"
                                    "\n"
                                    "go_goroutines 12\r\n"
                                    "  spaced { a = \"1\" , b=\"2\", } 3 1700000000000\n"
                                    "# HELP rpc_latency Latency of RPCs.\n"
                                    "# TYPE rpc_latency summary\n"
                                    "rpc_latency{quantile=\"0.5\"} 0.25\n"
                                    "rpc_latency_sum 17\n"
                                    "rpc_latency_count 40\n"
                                    "# TYPE up untyped\n"
                                    "up NaN\n"
                                    "# TYPE big gauge\n"
                                    "big -Inf -5\n"
                                    "# TYPE done counter\n"
                                    "done 4.5e3\n");
  EXPECT_EQ(parsed.value("go_goroutines"), 12);
  EXPECT_EQ(parsed.family("go_goroutines")->type, MetricType::GAUGE);
  EXPECT_EQ(parsed.value("spaced", {{"b", "2"}, {"a", "1"}}), 3);
  EXPECT_EQ(parsed.value("rpc_latency", {{"quantile", "0.5"}}), 0.25);
  EXPECT_EQ(parsed.family("rpc_latency")->type, MetricType::GAUGE);
  EXPECT_EQ(parsed.value("rpc_latency_sum"), 17);
  EXPECT_EQ(parsed.family("rpc_latency_count")->help, "Latency of RPCs.");
  EXPECT_TRUE(std::isnan(parsed.value("up")));
  EXPECT_EQ(parsed.value("big"), -INFINITY);
  EXPECT_EQ(parsed.family("done")->type, MetricType::COUNTER);
  EXPECT_EQ(parsed.value("done"), 4500);
  EXPECT_EQ(parsed.families().size(), 8u);
  // No text, no series.
  EXPECT_TRUE(parsePrometheusText("").families().empty());
  EXPECT_TRUE(parsePrometheusText("# TYPE nothing counter\n").families().empty());
}

TEST(MetricsTextTest, MalformedLinesAreRefusedWithTheirNumberAndText) {
  struct Case {
    const char* text;
    const char* says;
  };
  const Case cases[] = {
      {"ok 1\n9lives 1\n", "line 2: a sample line does not start with a metric name: '9lives 1'"},
      {"x{a=\"1\" 2\n", "labels must be separated by ',' and end with '}'"},
      {"x{a=1} 2\n", "the value of label 'a' is not quoted"},
      {"x{a=\"1} 2\n", "a label value is not closed"},
      {"x{a=\"\\t\"} 2\n", "a backslash that is not"},
      {"x{a=\"1\",a=\"2\"} 2\n", "label 'a' is given twice"},
      {"x{=\"1\"} 2\n", "a label name is missing"},
      {"x{a\"1\"} 2\n", "label 'a' has no '='"},
      {"x\n", "a sample has no value"},
      {"x one\n", "the value 'one' is not a number"},
      {"x 0x\n", "is not a number"},
      {"x 1 2 3\n", "more than a value and a timestamp"},
      {"x 1 soon\n", "the timestamp 'soon' is not a whole number"},
      {"x-y 1\n", "a metric name has a character it cannot have"},
      {"x 1\nx 2\n", "line 2: a series is given twice"},
      {"# TYPE x counter\n# TYPE x gauge\n", "a second TYPE line for 'x'"},
      {"# HELP x a\n# HELP x b\n", "a second HELP line for 'x'"},
      {"# HELP x a\\tb\n", "HELP text has a backslash"},
      {"# TYPE x meter\n", "unknown metric type 'meter'"},
      {"# TYPE x counter extra\n", "more than a name and a type"},
      {"# TYPE\n", "a TYPE line names no metric"},
      {"x 1\n# TYPE x counter\n", "the TYPE line for 'x' comes after its samples"},
      {"h_sum 1\n# TYPE h histogram\n", "histogram 'h' would take the samples of 'h_sum'"},
      {"# TYPE h histogram\nh 1\n", "is not its _bucket, _sum or _count"},
      {"# TYPE h histogram\nh_bucket 1\n", "a histogram bucket has no le label"},
      {"# TYPE h histogram\nh_bucket{le=\"x\"} 1\n", "the bucket bound 'x' is not a number"},
      {"# TYPE h histogram\nh_bucket{le=\"NaN\"} 1\n", "a bucket bound is NaN"},
      {"# TYPE h histogram\nh_count{le=\"1\"} 1\n", "take no le label"},
      {"# TYPE h histogram\nh_count 1.5\n", "counts are whole numbers"},
      {"# TYPE h histogram\nh_count -1\n", "counts are whole numbers"},
      {"# TYPE h histogram\nh_count 1e300\n", "counts are whole numbers"},
      {"# TYPE h histogram\nh_sum 1e300\n", "_sum is out of range"},
      {"# TYPE h histogram\nh_sum 1\nh_sum 2\n", "_sum is given twice"},
      {"# TYPE h histogram\nh_count 1\nh_count 2\n", "_count is given twice"},
      {"# TYPE h histogram\nh_bucket{le=\"1\"} 1\nh_bucket{le=\"1.0\"} 1\n",
       "line 2: the histogram series that starts here has a bucket given twice"},
      {"# TYPE h histogram\nh_bucket{le=\"1\"} 3\nh_bucket{le=\"2\"} 2\n",
       "line 2: the histogram series that starts here has counts that decrease"},
      {"# TYPE h histogram\nh_bucket{le=\"+Inf\"} 3\nh_count 4\n",
       "line 2: the histogram series that starts here has a _count unlike its +Inf bucket"},
      {"# TYPE h histogram\nh_bucket{le=\"1\"} 3\nh_count 2\n", "has a _count below its buckets"},
  };
  for (auto& c : cases) {
    auto failure = refusalOf(c.text);
    EXPECT_EQ(failure.code, ErrorCode::INVALID_ARGUMENT) << c.text;
    EXPECT_TRUE(failure.mentions(c.says)) << c.text << " -> " << failure.text;
    EXPECT_TRUE(failure.mentions("metrics text line ")) << failure.text;
  }
  // The line is quoted printable, and cut short.
  auto binary = refusalOf(std::string("x\x01\xfe 1\n").c_str());
  EXPECT_TRUE(binary.mentions("'x\\x01\\xfe 1'")) << binary.text;
  auto longLine = refusalOf(("x{a=\"" + std::string(1000, 'v') + "\" 1\n").c_str());
  EXPECT_TRUE(longLine.mentions("vvv...'")) << longLine.text;
  EXPECT_LT(longLine.text.size(), 400u) << longLine.text;
}

TEST(MetricsTextTest, WhatIsKeptIsBounded) {
  PrometheusTextLimits small{
      .maxBytes = 64, .maxSeries = 3, .maxSeriesPerFamily = 2, .maxLabels = 2, .maxBuckets = 2};
  auto bytes = refusalOf((std::string(65, '#') + "\n").c_str(), small);
  EXPECT_TRUE(bytes.mentions("metrics text of 66 bytes is over the limit of 64 bytes"))
      << bytes.text;
  EXPECT_TRUE(refusalOf("a 1\nb 1\nc 1\nd 1\n", small).mentions("line 4: more than 3 series"));
  EXPECT_TRUE(refusalOf("a{x=\"1\"} 1\na{x=\"2\"} 1\na 1\n", small)
                  .mentions("line 3: more than 2 series of 'a'"));
  EXPECT_TRUE(refusalOf("a{x=\"\",y=\"\",z=\"\"} 1\n", small).mentions("more than 2 labels"));
  EXPECT_TRUE(refusalOf("# TYPE a gauge\n# TYPE b gauge\n# TYPE c gauge\n# TYPE d gauge\n", small)
                  .mentions("more than 3 metrics are declared"));
  EXPECT_TRUE(refusalOf("# TYPE h histogram\nh_bucket{le=\"1\"} 1\nh_bucket{le=\"2\"} 1\n"
                        "h_bucket{le=\"3\"} 1\n",
                        {.maxBuckets = 2})
                  .mentions("line 4: a histogram has more than 2 buckets"));
  EXPECT_TRUE(refusalOf(("x " + std::string(200, '1') + "\n").c_str()).mentions("is not a number"));

  // The default: 16 MiB.
  std::string big(16 * 1024 * 1024 + 1, '\n');
  EXPECT_TRUE(refusalOf(big.c_str()).mentions("over the limit of 16777216 bytes"));
  big.pop_back();
  EXPECT_TRUE(parsePrometheusText(big.c_str()).families().empty());

  // 100,000 series are kept, 2,000 of one family.
  std::string many;
  for (int i = 0; i < 100'000; ++i) {
    many += "m" + std::to_string(i % 50) + "{i=\"" + std::to_string(i) + "\"} 1\n";
  }
  EXPECT_EQ(parsePrometheusText(many.c_str()).sum("m3"), 2'000);
  EXPECT_TRUE(
      refusalOf((many + "one_more 1\n").c_str()).mentions("line 100001: more than 100000 series"));
}

TEST(MetricsTextTest, EveryCutOfValidTextParsesOrIsRefused) {
  MetricsSnapshot m;
  LatencyHistogram h;
  h.record(7 * kj::MILLISECONDS);
  m.addHistogram("troupe_h_seconds", "h", {{"job", "j\"1"}}, h);
  m.add("troupe_c_total", "c", MetricType::COUNTER, {{"job", "j"}, {"code", "ok"}}, 3);
  m.add("troupe_g", "g\\", MetricType::GAUGE, {}, 0.25);
  auto text = m.toPrometheusText();
  for (size_t cut = 0; cut <= text.size(); ++cut) {
    auto part = kj::heapString(text.data(), cut);
    KJ_IF_MAYBE(e, kj::runCatchingExceptions([&]() { parsePrometheusText(part); })) {
      EXPECT_EQ(errorCode(*e), ErrorCode::INVALID_ARGUMENT) << e->getDescription().cStr();
    }
  }
}

}  // namespace
}  // namespace troupe::test
