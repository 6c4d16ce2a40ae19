#pragma once
// MetricsHistory: what the registry's dashboard draws. Every interval the registry reads each
// endpoint's /metrics (MetricsReader) and hands this what the endpoint's calls have added up to
// so far; it keeps, per endpoint and per job, a ring of samples of what happened in each
// interval: calls/s, errors/s by code, p50 and p99.
//
// Memory: a Sample is 48 bytes, so a series of `length / interval` samples (180 at the defaults,
// 15 min at 5 s) holds 8,640 bytes, plus about 400 bytes of totals kept to take the next
// difference from: about 9 KiB per endpoint and per job. At most `maxSeries` series (endpoints
// and jobs together; 2,000 by default, about 18 MiB); past it, an endpoint gets no history until
// older ones age out (a series not read for `length` is forgotten).

#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <kj/string.h>
#include <kj/time.h>

#include "troupe/base/metrics.h"

namespace troupe::resolver_detail {

struct HistoryOptions {
  kj::Duration interval = 5 * kj::SECONDS;  // between reads; 0: no history
  kj::Duration length = 15 * kj::MINUTES;   // how far back it goes
  size_t maxSeries = 2000;                  // endpoints and jobs together
};

// What an endpoint's calls have added up to when it was read.
struct CallTotals {
  CallOutcomes outcomes;
  LatencyHistogram latency;
};

// The totals of the calls to actor `actor` of job `job` in a server's metrics
// (troupe_calls_total and troupe_call_duration_seconds, every method together).
CallTotals callTotals(const MetricsSnapshot& metrics, kj::StringPtr job, kj::StringPtr actor);

class MetricsHistory {
public:
  // The codes a sample keeps apart; the rest of its errors count only in `errors`.
  static constexpr size_t TOP_CODES = 3;
  static constexpr uint8_t NO_CODE = 0xff;

  // What happened in one interval.
  struct Sample {
    int64_t atMillis = 0;  // the end of the interval (wall clock, Unix epoch)
    float calls = 0;       // finished per second, errors included
    float errors = 0;      // per second, every code
    float p50 = 0;         // seconds; 0 when no call finished
    float p99 = 0;
    // The codes with the most errors (ErrorCode values, NO_CODE for none), per second.
    std::array<std::pair<uint8_t, float>, TOP_CODES> byCode{};
  };

  struct Series {
    std::string jobId;
    std::vector<Sample> ring;  // oldest at `next` once full
    size_t next = 0;
    // The totals read last, and when: the next sample is what was added since.
    CallTotals last;
    bool hasLast = false;
    int64_t lastAtMillis = 0;
    uint64_t lastRound = 0;  // the round that last read it

    // The samples, oldest first.
    std::vector<Sample> samples() const;
  };

  explicit MetricsHistory(HistoryOptions options);

  const HistoryOptions& options() const { return options_; }

  // One round of reads at `nowMillis`: add() each endpoint read, then endRound(), which adds
  // the jobs' samples (their endpoints' together) and forgets what was not read for `length`.
  void beginRound(int64_t nowMillis);
  void add(const std::string& endpoint, const std::string& jobId, const CallTotals& totals);
  void endRound();

  // The series of an endpoint or a job; null when it has none.
  const Series* endpoint(kj::StringPtr name) const;
  const Series* job(kj::StringPtr jobId) const;
  const std::map<std::string, Series, std::less<>>& endpoints() const { return endpoints_; }
  const std::map<std::string, Series, std::less<>>& jobs() const { return jobs_; }

  size_t seriesCount() const { return endpoints_.size() + jobs_.size(); }
  // Endpoints that got no series for maxSeries, in the last round.
  size_t refused() const { return refused_; }
  // What the series hold, in bytes (estimated as the header says).
  size_t memoryBytes() const;

private:
  struct JobRound {
    float calls = 0;
    std::array<float, CallOutcomes::CODES> errors{};
    LatencyHistogram latency;
    bool any = false;
  };

  Series* series(std::map<std::string, Series, std::less<>>& in, const std::string& name,
                 const std::string& jobId);
  void push(Series& series, Sample sample);

  HistoryOptions options_;
  size_t capacity;  // samples per series
  std::map<std::string, Series, std::less<>> endpoints_;
  std::map<std::string, Series, std::less<>> jobs_;
  std::map<std::string, JobRound> round_;
  int64_t nowMillis = 0;
  uint64_t roundNumber = 0;
  size_t refused_ = 0;
  size_t refusedThisRound = 0;
};

}  // namespace troupe::resolver_detail
