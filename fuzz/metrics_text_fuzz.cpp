// parsePrometheusText (tools/troupe/metrics_text.h), fed arbitrary text as a member's /metrics
// might send it, under small limits so that inputs reach them.
//
// Refusals (INVALID_ARGUMENT) are fine. Checked: what parses holds to the limits; each
// histogram's buckets add up to its count; the snapshot printed (toPrometheusText) parses back to
// one that prints the same text.

#include <string>

#include "troupe/base/errors.h"
#include "troupe/observe/metrics_text.h"
#include "fuzz/fuzz_support.h"

namespace troupe::fuzz {
namespace {

// A histogram printed takes LatencyHistogram::BUCKETS bucket lines, which must read back.
const PrometheusTextLimits LIMITS{.maxBytes = 1 << 20,
                                  .maxSeries = 64,
                                  .maxSeriesPerFamily = 16,
                                  .maxLabels = 8,
                                  .maxBuckets = 32};

void checkShape(const MetricsSnapshot& snapshot) {
  size_t series = 0;
  for (auto& [name, family] : snapshot.families()) {
    check(name == family.name, "a family is filed under another name");
    check(!family.samples.empty(), "a family without series");
    check(family.samples.size() <= LIMITS.maxSeriesPerFamily, "a family over its limit");
    series += family.samples.size();
    for (auto& s : family.samples) {
      check(s.labels.size() <= LIMITS.maxLabels, "a series with more labels than the limit");
      if (family.type != MetricType::HISTOGRAM) continue;
      uint64_t total = 0;
      for (auto c : s.histogram.counts) total += c;
      check(total == s.histogram.count, "a histogram's buckets do not add up to its count");
    }
  }
  check(series <= LIMITS.maxSeries, "more series than the limit");
}

}  // namespace
}  // namespace troupe::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace troupe;
  using namespace troupe::fuzz;
  NoStackTraces noStackTraces;
  auto text = kj::heapString(reinterpret_cast<const char*>(data), size);
  MetricsSnapshot parsed;
  KJ_IF_MAYBE(e, kj::runCatchingExceptions([&]() { parsed = parsePrometheusText(text, LIMITS); })) {
    if (errorCode(*e) != ErrorCode::INVALID_ARGUMENT) {
      fprintf(stderr, "fuzz: %s\n", e->getDescription().cStr());
      check(false, "the parser failed with something other than INVALID_ARGUMENT");
    }
    return 0;
  }
  checkShape(parsed);
  auto printed = parsed.toPrometheusText();
  std::string again;
  KJ_IF_MAYBE(e, kj::runCatchingExceptions([&]() {
                again = parsePrometheusText(kj::StringPtr(printed.c_str(), printed.size()), LIMITS)
                            .toPrometheusText();
              })) {
    fprintf(stderr, "fuzz: %s\n", e->getDescription().cStr());
    check(false, "a parsed snapshot, printed, does not parse back");
  }
  check(again == printed, "a parsed snapshot, printed and parsed again, prints differently");
  return 0;
}
