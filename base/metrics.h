#pragma once
// Metrics: counters, gauges and fixed-bucket latency histograms that troupe's components keep
// on their loop, and the value they are read into.
//
// Every component keeps its own counters as plain integers on its loop's thread: counting a
// call is an increment, and timing one is a bucket search and an increment, with no lock, no
// atomic and no allocation. Reading them (a program asking server.metrics(), an HTTP scrape of
// /metrics) collects every source on the loop into one MetricsSnapshot, merging series whose
// names and labels agree (two servers of one job on one loop sum), and renders it in the
// Prometheus text exposition format.
//
// Names follow Prometheus' conventions: a `troupe_` prefix, `_total` on counters, base units
// (`_seconds`, `_bytes`), and the labels `job`, `actor`, `method`, `code` (an error code's name
// from errors.h, "ok", or "cancelled"), `member` (an endpoint name). README.md lists every
// family troupe exposes.

#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <kj/string.h>
#include <kj/time.h>

#include "troupe/base/errors.h"

namespace troupe {

// Upper bounds of the latency buckets, in nanoseconds: 5 us to 60 s in steps of about 2.5x, and
// +Inf past the last. Fixed, so histograms from any process and any loop add up bucket by bucket.
constexpr std::array<int64_t, 22> LATENCY_BUCKET_BOUNDS_NS = {
    5'000,         10'000,         25'000,         50'000,        100'000,       250'000,
    500'000,       1'000'000,      2'500'000,      5'000'000,     10'000'000,    25'000'000,
    50'000'000,    100'000'000,    250'000'000,    500'000'000,   1'000'000'000, 2'500'000'000,
    5'000'000'000, 10'000'000'000, 30'000'000'000, 60'000'000'000};

// A latency histogram: counts per bucket (not cumulative; the last is +Inf), the count and the
// sum. A value type; record() belongs to whoever owns the instance (one loop).
struct LatencyHistogram {
  static constexpr size_t BUCKETS = LATENCY_BUCKET_BOUNDS_NS.size() + 1;

  std::array<uint64_t, BUCKETS> counts{};
  uint64_t count = 0;
  int64_t sumNanos = 0;

  void record(kj::Duration duration);
  void add(const LatencyHistogram& other);

  // The latency below which a fraction `q` (0 to 1) of the recorded values lie, interpolated
  // within its bucket as Prometheus' histogram_quantile() does; 0 when nothing was recorded,
  // the last finite bound for values in +Inf.
  double quantileSeconds(double q) const;
  double sumSeconds() const { return static_cast<double>(sumNanos) / 1e9; }
};

// What `histogram` recorded since `earlier` (an older copy of the same histogram): for rates
// and recent quantiles from two scrapes.
LatencyHistogram since(const LatencyHistogram& histogram, const LatencyHistogram& earlier);

// Calls counted by error code (ErrorCode's values in order), plus those that finished well and
// those their callers cancelled.
struct CallOutcomes {
  static constexpr size_t CODES = static_cast<size_t>(ErrorCode::BLOB_ABORTED) + 1;

  uint64_t ok = 0;
  uint64_t cancelled = 0;
  std::array<uint64_t, CODES> errors{};

  void countError(ErrorCode code) { ++errors[static_cast<size_t>(code)]; }
  uint64_t error(ErrorCode code) const { return errors[static_cast<size_t>(code)]; }
  uint64_t errorTotal() const;
  uint64_t total() const { return ok + cancelled + errorTotal(); }
  void add(const CallOutcomes& other);
};

// Messages at least this large (framing included) are counted apart, as "large".
constexpr uint64_t LARGE_MESSAGE_BYTES = 64 * 1024;

// What crossed one side's connections (a server's, all of them together). Loop thread only.
struct TransportCounters {
  uint64_t connectionsAccepted = 0;  // served (past TLS and the connection bound)
  uint64_t connectionsRefused = 0;   // closed at once for the connection bound
  uint64_t messagesReceived = 0;
  uint64_t messagesSent = 0;
  uint64_t bytesReceived = 0;  // whole messages, framing included
  uint64_t bytesSent = 0;
  uint64_t largeMessagesReceived = 0;  // of LARGE_MESSAGE_BYTES or more
  uint64_t largeMessagesSent = 0;
  uint64_t sharedMessagesReceived = 0;  // through shared memory (same host), of those above
  uint64_t sharedMessagesSent = 0;

  void received(uint64_t bytes) {
    ++messagesReceived;
    bytesReceived += bytes;
    if (bytes >= LARGE_MESSAGE_BYTES) ++largeMessagesReceived;
  }
  void sent(uint64_t bytes) {
    ++messagesSent;
    bytesSent += bytes;
    if (bytes >= LARGE_MESSAGE_BYTES) ++largeMessagesSent;
  }
};

// ---------------------------------------------------------------------------------------------
// The value every read produces.

enum class MetricType : uint8_t { COUNTER, GAUGE, HISTOGRAM };

using MetricLabels = std::vector<std::pair<std::string, std::string>>;

// One series of a family: its labels and its value (counters and gauges) or histogram.
struct MetricSample {
  MetricLabels labels;
  double value = 0;
  LatencyHistogram histogram;  // HISTOGRAM families only
};

struct MetricFamily {
  std::string name;  // "troupe_calls_total"
  std::string help;
  MetricType type = MetricType::COUNTER;
  std::vector<MetricSample> samples;  // in the order first added
  // Each sample's labels, sorted and joined, to its index in `samples`.
  std::map<std::string, size_t> index;

  // The sample with exactly these labels (in any order), or null.
  const MetricSample* find(const MetricLabels& labels) const;
};

// Everything one read collected, by family name. A value: copy it, keep it, compare two.
class MetricsSnapshot {
public:
  // Adds to the counter or gauge `name` with `labels`: a new series, or the sum with the series
  // of the same labels already there. `help` and `type` are taken from the first add of a name;
  // a later one with another type is a caller's bug (KJ_REQUIRE).
  void add(kj::StringPtr name, kj::StringPtr help, MetricType type, MetricLabels labels,
           double value);
  void addHistogram(kj::StringPtr name, kj::StringPtr help, MetricLabels labels,
                    const LatencyHistogram& histogram);
  // Every series of `other`, added as above.
  void merge(const MetricsSnapshot& other);

  // The family `name`, or null.
  const MetricFamily* family(kj::StringPtr name) const;

  // The value of the series `name` with exactly `labels`; 0 when there is none (a counter that
  // never counted is not exposed).
  double value(kj::StringPtr name, const MetricLabels& labels = {}) const;
  // The histogram of that series; empty when there is none.
  LatencyHistogram histogram(kj::StringPtr name, const MetricLabels& labels = {}) const;
  // The sum of every series of `name` whose labels include all of `labels`.
  double sum(kj::StringPtr name, const MetricLabels& labels = {}) const;

  const std::map<std::string, MetricFamily>& families() const { return families_; }

  // The Prometheus text exposition format (version 0.0.4): HELP and TYPE lines, then the
  // series; histograms as cumulative `_bucket{le=...}` series, `_sum` and `_count`. Label values
  // are escaped as the format says, so any text (an actor name from the network) is safe.
  std::string toPrometheusText() const;

private:
  MetricSample& series(kj::StringPtr name, kj::StringPtr help, MetricType type,
                       MetricLabels labels);
  std::map<std::string, MetricFamily> families_;
};

// Something on a loop that keeps metrics: a server, a pool, the registry. Loop thread only.
class MetricsSource {
public:
  virtual ~MetricsSource() noexcept(false) = default;
  // Adds this source's series to `out`.
  virtual void collectMetrics(MetricsSnapshot& out) const = 0;
};

// The metrics sources of one loop (EventLoop::metrics()). A source adds itself when it is made
// and removes itself (through the Registration) when it goes. Loop thread only.
class MetricsSet {
public:
  MetricsSet() = default;
  KJ_DISALLOW_COPY(MetricsSet);

  // Keeps `source` in the set until dropped; `source` must outlive it.
  class Registration {
  public:
    Registration() = default;
    Registration(Registration&& other) noexcept;
    Registration& operator=(Registration&& other) noexcept;
    ~Registration() noexcept(false);

  private:
    friend class MetricsSet;
    Registration(MetricsSet& set, const MetricsSource& source) : set(&set), source(&source) {}
    void release();
    MetricsSet* set = nullptr;  // null once moved from
    const MetricsSource* source = nullptr;
  };

  [[nodiscard]] Registration add(const MetricsSource& source);

  // Collects every source, in the order added.
  MetricsSnapshot collect() const;

private:
  std::vector<const MetricsSource*> sources;
};

}  // namespace troupe
