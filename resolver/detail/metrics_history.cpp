#include "troupe/resolver/detail/metrics_history.h"

#include <algorithm>

#include <kj/debug.h>

#include "troupe/base/errors.h"

namespace troupe::resolver_detail {

namespace {

kj::Maybe<kj::StringPtr> label(const MetricLabels& labels, kj::StringPtr key) {
  for (auto& [k, v] : labels) {
    if (key == k.c_str()) return kj::StringPtr(v.c_str(), v.size());
  }
  return nullptr;
}

bool matches(const MetricLabels& labels, kj::StringPtr job, kj::StringPtr actor) {
  auto j = label(labels, "job");
  auto a = label(labels, "actor");
  return j != nullptr && a != nullptr && KJ_ASSERT_NONNULL(j) == job &&
         KJ_ASSERT_NONNULL(a) == actor;
}

// The ErrorCode named `name` (errorCodeName()); FAILED for a name this version does not know.
size_t codeIndex(kj::StringPtr name) {
  for (size_t c = 0; c < CallOutcomes::CODES; ++c) {
    if (errorCodeName(static_cast<ErrorCode>(c)) == name) return c;
  }
  return static_cast<size_t>(ErrorCode::FAILED);
}

uint64_t count(double value) { return value > 0 ? static_cast<uint64_t>(value) : 0; }

// What `now` added since `before`; null when a counter went down (the server restarted).
kj::Maybe<CallTotals> difference(const CallTotals& now, const CallTotals& before) {
  CallTotals d;
  auto sub = [](uint64_t a, uint64_t b, uint64_t& out) {
    out = a - b;
    return a >= b;
  };
  bool ok = sub(now.outcomes.ok, before.outcomes.ok, d.outcomes.ok) &&
            sub(now.outcomes.cancelled, before.outcomes.cancelled, d.outcomes.cancelled) &&
            sub(now.latency.count, before.latency.count, d.latency.count);
  for (size_t c = 0; ok && c < CallOutcomes::CODES; ++c) {
    ok = sub(now.outcomes.errors[c], before.outcomes.errors[c], d.outcomes.errors[c]);
  }
  for (size_t b = 0; ok && b < LatencyHistogram::BUCKETS; ++b) {
    ok = sub(now.latency.counts[b], before.latency.counts[b], d.latency.counts[b]);
  }
  if (!ok) return nullptr;
  d.latency.sumNanos = now.latency.sumNanos - before.latency.sumNanos;
  return d;
}

MetricsHistory::Sample sampleOf(int64_t atMillis, float calls,
                                const std::array<float, CallOutcomes::CODES>& errors,
                                const LatencyHistogram& latency) {
  MetricsHistory::Sample s;
  s.atMillis = atMillis;
  s.calls = calls;
  std::array<std::pair<float, uint8_t>, CallOutcomes::CODES> ranked;
  for (size_t c = 0; c < CallOutcomes::CODES; ++c) {
    s.errors += errors[c];
    ranked[c] = {errors[c], static_cast<uint8_t>(c)};
  }
  std::partial_sort(ranked.begin(), ranked.begin() + MetricsHistory::TOP_CODES, ranked.end(),
                    [](auto& a, auto& b) { return a.first > b.first; });
  for (size_t i = 0; i < MetricsHistory::TOP_CODES; ++i) {
    s.byCode[i] = ranked[i].first > 0 ? std::make_pair(ranked[i].second, ranked[i].first)
                                      : std::make_pair(MetricsHistory::NO_CODE, 0.0f);
  }
  if (latency.count > 0) {
    s.p50 = static_cast<float>(latency.quantileSeconds(0.5));
    s.p99 = static_cast<float>(latency.quantileSeconds(0.99));
  }
  return s;
}

}  // namespace

CallTotals callTotals(const MetricsSnapshot& metrics, kj::StringPtr job, kj::StringPtr actor) {
  CallTotals totals;
  if (auto* calls = metrics.family("troupe_calls_total")) {
    for (auto& s : calls->samples) {
      if (!matches(s.labels, job, actor)) continue;
      auto code = label(s.labels, "code").orDefault("ok");
      if (code == "ok") {
        totals.outcomes.ok += count(s.value);
      } else if (code == "cancelled") {
        totals.outcomes.cancelled += count(s.value);
      } else {
        totals.outcomes.errors[codeIndex(code)] += count(s.value);
      }
    }
  }
  if (auto* latency = metrics.family("troupe_call_duration_seconds")) {
    for (auto& s : latency->samples) {
      if (matches(s.labels, job, actor)) totals.latency.add(s.histogram);
    }
  }
  return totals;
}

std::vector<MetricsHistory::Sample> MetricsHistory::Series::samples() const {
  std::vector<Sample> out;
  out.reserve(ring.size());
  for (size_t i = 0; i < ring.size(); ++i) out.push_back(ring[(next + i) % ring.size()]);
  return out;
}

MetricsHistory::MetricsHistory(HistoryOptions options)
    : options_(options),
      capacity(options.interval > 0 * kj::SECONDS
                   ? static_cast<size_t>(kj::max(int64_t{1}, options.length / options.interval))
                   : 1) {}

void MetricsHistory::beginRound(int64_t now) {
  nowMillis = now;
  ++roundNumber;
  round_.clear();
  refusedThisRound = 0;
}

MetricsHistory::Series* MetricsHistory::series(std::map<std::string, Series, std::less<>>& in,
                                               const std::string& name, const std::string& jobId) {
  auto it = in.find(name);
  if (it != in.end()) return &it->second;
  if (seriesCount() >= options_.maxSeries) return nullptr;
  auto& s = in[name];
  s.jobId = jobId;
  return &s;
}

void MetricsHistory::push(Series& s, Sample sample) {
  if (s.ring.size() < capacity) {
    if (s.ring.empty()) s.ring.reserve(capacity);  // exactly: growing by doubling would waste
    s.ring.push_back(sample);
  } else {
    s.ring[s.next] = sample;
    s.next = (s.next + 1) % capacity;
  }
}

void MetricsHistory::add(const std::string& endpoint, const std::string& jobId,
                         const CallTotals& totals) {
  // An endpoint's series comes with its job's, so that every job with history has its totals.
  auto* jobSeries = series(jobs_, jobId, jobId);
  auto* s = jobSeries == nullptr ? nullptr : series(endpoints_, endpoint, jobId);
  if (s == nullptr) {
    ++refusedThisRound;
    return;
  }
  jobSeries->lastRound = roundNumber;
  s->lastRound = roundNumber;
  auto seconds = static_cast<float>(nowMillis - s->lastAtMillis) / 1000.0f;
  kj::Maybe<CallTotals> added;
  if (s->hasLast && seconds > 0) added = difference(totals, s->last);
  s->last = totals;
  s->hasLast = true;
  s->lastAtMillis = nowMillis;
  KJ_IF_MAYBE(d, added) {
    std::array<float, CallOutcomes::CODES> errors{};
    for (size_t c = 0; c < CallOutcomes::CODES; ++c) {
      errors[c] = static_cast<float>(d->outcomes.errors[c]) / seconds;
    }
    auto calls = static_cast<float>(d->outcomes.total()) / seconds;
    push(*s, sampleOf(nowMillis, calls, errors, d->latency));
    auto& job = round_[jobId];
    job.any = true;
    job.calls += calls;
    for (size_t c = 0; c < CallOutcomes::CODES; ++c) job.errors[c] += errors[c];
    job.latency.add(d->latency);
  }
}

void MetricsHistory::endRound() {
  for (auto& [jobId, r] : round_) {
    if (auto* s = series(jobs_, jobId, jobId)) {
      s->lastRound = roundNumber;
      push(*s, sampleOf(nowMillis, r.calls, r.errors, r.latency));
    }
  }
  round_.clear();
  refused_ = refusedThisRound;
  // Forget what was not read for as long as the history goes back.
  for (auto* in : {&endpoints_, &jobs_}) {
    for (auto it = in->begin(); it != in->end();) {
      if (roundNumber - it->second.lastRound >= capacity) {
        it = in->erase(it);
      } else {
        ++it;
      }
    }
  }
}

const MetricsHistory::Series* MetricsHistory::endpoint(kj::StringPtr name) const {
  auto it = endpoints_.find(std::string_view(name.begin(), name.size()));
  return it == endpoints_.end() ? nullptr : &it->second;
}

const MetricsHistory::Series* MetricsHistory::job(kj::StringPtr jobId) const {
  auto it = jobs_.find(std::string_view(jobId.begin(), jobId.size()));
  return it == jobs_.end() ? nullptr : &it->second;
}

size_t MetricsHistory::memoryBytes() const {
  size_t bytes = 0;
  for (auto* in : {&endpoints_, &jobs_}) {
    for (auto& [name, s] : *in) {
      bytes += sizeof(s) + name.capacity() + s.jobId.capacity() +
               s.ring.capacity() * sizeof(Sample);
    }
  }
  return bytes;
}

}  // namespace troupe::resolver_detail
