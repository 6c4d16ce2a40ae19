#include "troupe/base/metrics.h"

#include <algorithm>
#include <charconv>
#include <cinttypes>
#include <cmath>
#include <cstdio>

#include <kj/debug.h>

namespace troupe {

void LatencyHistogram::record(kj::Duration duration) {
  int64_t nanos = duration / kj::NANOSECONDS;
  if (nanos < 0) nanos = 0;
  auto bound = std::lower_bound(LATENCY_BUCKET_BOUNDS_NS.begin(), LATENCY_BUCKET_BOUNDS_NS.end(),
                                nanos);
  ++counts[bound - LATENCY_BUCKET_BOUNDS_NS.begin()];
  ++count;
  sumNanos += nanos;
}

void LatencyHistogram::add(const LatencyHistogram& other) {
  for (size_t i = 0; i < BUCKETS; ++i) counts[i] += other.counts[i];
  count += other.count;
  sumNanos += other.sumNanos;
}

double LatencyHistogram::quantileSeconds(double q) const {
  if (count == 0) return 0;
  q = std::clamp(q, 0.0, 1.0);
  double rank = q * static_cast<double>(count);
  uint64_t below = 0;
  for (size_t i = 0; i < BUCKETS; ++i) {
    if (counts[i] == 0 || static_cast<double>(below + counts[i]) < rank) {
      below += counts[i];
      continue;
    }
    if (i == BUCKETS - 1) return static_cast<double>(LATENCY_BUCKET_BOUNDS_NS.back()) / 1e9;
    double lower = i == 0 ? 0 : static_cast<double>(LATENCY_BUCKET_BOUNDS_NS[i - 1]);
    double upper = static_cast<double>(LATENCY_BUCKET_BOUNDS_NS[i]);
    double within = (rank - static_cast<double>(below)) / static_cast<double>(counts[i]);
    return (lower + (upper - lower) * within) / 1e9;
  }
  return static_cast<double>(LATENCY_BUCKET_BOUNDS_NS.back()) / 1e9;
}

LatencyHistogram since(const LatencyHistogram& histogram, const LatencyHistogram& earlier) {
  // A series that went backwards (its process restarted) counts from zero.
  if (histogram.count < earlier.count) return histogram;
  LatencyHistogram d;
  for (size_t i = 0; i < LatencyHistogram::BUCKETS; ++i) {
    d.counts[i] = histogram.counts[i] >= earlier.counts[i] ? histogram.counts[i] - earlier.counts[i]
                                                           : 0;
  }
  d.count = histogram.count - earlier.count;
  d.sumNanos = histogram.sumNanos - earlier.sumNanos;
  return d;
}

uint64_t CallOutcomes::errorTotal() const {
  uint64_t n = 0;
  for (auto e : errors) n += e;
  return n;
}

void CallOutcomes::add(const CallOutcomes& other) {
  ok += other.ok;
  cancelled += other.cancelled;
  for (size_t i = 0; i < CODES; ++i) errors[i] += other.errors[i];
}

// ---------------------------------------------------------------------------------------------

namespace {

// `labels` in one string that does not depend on their order: sorted by name, each name and
// value followed by a byte no label holds unescaped.
std::string labelKey(const MetricLabels& labels) {
  std::vector<const std::pair<std::string, std::string>*> sorted;
  sorted.reserve(labels.size());
  for (auto& l : labels) sorted.push_back(&l);
  std::sort(sorted.begin(), sorted.end(), [](auto* a, auto* b) { return *a < *b; });
  std::string key;
  for (auto* l : sorted) {
    key += l->first;
    key += '\x01';
    key += l->second;
    key += '\x02';
  }
  return key;
}

bool includesLabels(const MetricLabels& labels, const MetricLabels& wanted) {
  for (auto& w : wanted) {
    if (std::find(labels.begin(), labels.end(), w) == labels.end()) return false;
  }
  return true;
}

kj::StringPtr typeName(MetricType type) {
  switch (type) {
    case MetricType::COUNTER:
      return "counter";
    case MetricType::GAUGE:
      return "gauge";
    case MetricType::HISTOGRAM:
      return "histogram";
  }
  KJ_UNREACHABLE;
}

// The exposition format's escapes: in HELP text backslash and newline, in label values also the
// double quote.
void appendEscaped(std::string& out, const std::string& text, bool quote) {
  for (char c : text) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else if (quote && c == '"') {
      out += "\\\"";
    } else {
      out += c;
    }
  }
}

void appendNumber(std::string& out, double value) {
  char text[32];
  if (std::isinf(value)) {
    out += value > 0 ? "+Inf" : "-Inf";
    return;
  }
  if (value == std::floor(value) && std::fabs(value) < 1e15) {
    snprintf(text, sizeof(text), "%" PRId64, static_cast<int64_t>(value));
    out += text;
    return;
  }
  // The shortest text that reads back as the same double, so a scrape loses nothing and a
  // parsed snapshot prints as it was printed.
  auto written = std::to_chars(text, text + sizeof(text), value);
  out.append(text, written.ptr);
}

void appendSeries(std::string& out, const std::string& name, const MetricLabels& labels,
                  const char* extraName, const std::string& extraValue, double value) {
  out += name;
  if (!labels.empty() || extraName != nullptr) {
    out += '{';
    bool first = true;
    for (auto& [key, text] : labels) {
      if (!first) out += ',';
      first = false;
      out += key;
      out += "=\"";
      appendEscaped(out, text, true);
      out += '"';
    }
    if (extraName != nullptr) {
      if (!first) out += ',';
      out += extraName;
      out += "=\"";
      out += extraValue;
      out += '"';
    }
    out += '}';
  }
  out += ' ';
  appendNumber(out, value);
  out += '\n';
}

std::string boundText(int64_t nanos) {
  char text[32];
  snprintf(text, sizeof(text), "%g", static_cast<double>(nanos) / 1e9);
  return text;
}

}  // namespace

const MetricSample* MetricFamily::find(const MetricLabels& labels) const {
  auto it = index.find(labelKey(labels));
  return it == index.end() ? nullptr : &samples[it->second];
}

MetricSample& MetricsSnapshot::series(kj::StringPtr name, kj::StringPtr help, MetricType type,
                                      MetricLabels labels) {
  // Sized copies: text from the network may hold NUL bytes, which cStr() would cut at.
  std::string key(name.begin(), name.size());
  auto [it, made] = families_.try_emplace(key);
  auto& family = it->second;
  if (made) {
    family.name = kj::mv(key);
    family.help = std::string(help.begin(), help.size());
    family.type = type;
  }
  KJ_REQUIRE(family.type == type, "a metric family added with two types", name);
  auto [at, added] = family.index.try_emplace(labelKey(labels), family.samples.size());
  if (!added) return family.samples[at->second];
  family.samples.push_back(MetricSample{kj::mv(labels), 0, {}});
  return family.samples.back();
}

void MetricsSnapshot::add(kj::StringPtr name, kj::StringPtr help, MetricType type,
                          MetricLabels labels, double value) {
  KJ_REQUIRE(type != MetricType::HISTOGRAM, "use addHistogram()", name);
  series(name, help, type, kj::mv(labels)).value += value;
}

void MetricsSnapshot::addHistogram(kj::StringPtr name, kj::StringPtr help, MetricLabels labels,
                                   const LatencyHistogram& histogram) {
  series(name, help, MetricType::HISTOGRAM, kj::mv(labels)).histogram.add(histogram);
}

void MetricsSnapshot::merge(const MetricsSnapshot& other) {
  for (auto& [name, family] : other.families_) {
    for (auto& s : family.samples) {
      auto& mine = series(name, family.help, family.type, s.labels);
      mine.value += s.value;
      mine.histogram.add(s.histogram);
    }
  }
}

const MetricFamily* MetricsSnapshot::family(kj::StringPtr name) const {
  auto it = families_.find(std::string(name.begin(), name.size()));
  return it == families_.end() ? nullptr : &it->second;
}

double MetricsSnapshot::value(kj::StringPtr name, const MetricLabels& labels) const {
  auto f = family(name);
  if (f == nullptr) return 0;
  auto s = f->find(labels);
  return s == nullptr ? 0 : s->value;
}

LatencyHistogram MetricsSnapshot::histogram(kj::StringPtr name, const MetricLabels& labels) const {
  auto f = family(name);
  if (f == nullptr) return {};
  auto s = f->find(labels);
  return s == nullptr ? LatencyHistogram{} : s->histogram;
}

double MetricsSnapshot::sum(kj::StringPtr name, const MetricLabels& labels) const {
  auto f = family(name);
  if (f == nullptr) return 0;
  double total = 0;
  for (auto& s : f->samples) {
    if (includesLabels(s.labels, labels)) {
      total += f->type == MetricType::HISTOGRAM ? static_cast<double>(s.histogram.count) : s.value;
    }
  }
  return total;
}

std::string MetricsSnapshot::toPrometheusText() const {
  std::string out;
  for (auto& [name, family] : families_) {
    out += "# HELP ";
    out += name;
    out += ' ';
    appendEscaped(out, family.help, false);
    out += "\n# TYPE ";
    out += name;
    out += ' ';
    out += typeName(family.type).cStr();
    out += '\n';
    for (auto& s : family.samples) {
      if (family.type != MetricType::HISTOGRAM) {
        appendSeries(out, name, s.labels, nullptr, {}, s.value);
        continue;
      }
      uint64_t cumulative = 0;
      for (size_t i = 0; i < LatencyHistogram::BUCKETS; ++i) {
        cumulative += s.histogram.counts[i];
        auto le = i + 1 < LatencyHistogram::BUCKETS ? boundText(LATENCY_BUCKET_BOUNDS_NS[i])
                                                    : std::string("+Inf");
        appendSeries(out, name + "_bucket", s.labels, "le", le, static_cast<double>(cumulative));
      }
      appendSeries(out, name + "_sum", s.labels, nullptr, {}, s.histogram.sumSeconds());
      appendSeries(out, name + "_count", s.labels, nullptr, {},
                   static_cast<double>(s.histogram.count));
    }
  }
  return out;
}

// ---------------------------------------------------------------------------------------------

MetricsSet::Registration::Registration(Registration&& other) noexcept
    : set(other.set), source(other.source) {
  other.set = nullptr;
}

MetricsSet::Registration& MetricsSet::Registration::operator=(Registration&& other) noexcept {
  if (this != &other) {
    release();
    set = other.set;
    source = other.source;
    other.set = nullptr;
  }
  return *this;
}

MetricsSet::Registration::~Registration() noexcept(false) { release(); }

void MetricsSet::Registration::release() {
  if (set == nullptr) return;
  auto& s = set->sources;
  s.erase(std::remove(s.begin(), s.end(), source), s.end());
  set = nullptr;
}

MetricsSet::Registration MetricsSet::add(const MetricsSource& source) {
  sources.push_back(&source);
  return Registration(*this, source);
}

MetricsSnapshot MetricsSet::collect() const {
  MetricsSnapshot out;
  for (auto* s : sources) s->collectMetrics(out);
  return out;
}

}  // namespace troupe
