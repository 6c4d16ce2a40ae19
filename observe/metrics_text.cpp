#include "troupe/observe/metrics_text.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include <kj/debug.h>

#include "troupe/base/errors.h"
#include "troupe/base/parse_number.h"

namespace troupe {

namespace {

// A number longer than this is refused rather than handed to strtod (a value of a million digits
// would take it long to read).
constexpr size_t MAX_NUMBER_CHARS = 128;

// Counts in a histogram: whole numbers below 2^63, so that sums of them stay in 64 bits.
constexpr double MAX_COUNT = 9223372036854775808.0;
// A histogram's sum, in seconds: its nanoseconds must fit an int64.
constexpr double MAX_SUM_SECONDS = 9.2e9;

enum class Declared : uint8_t { NONE, COUNTER, GAUGE, UNTYPED, SUMMARY, HISTOGRAM };

// What the HELP and TYPE lines said about a name.
struct Declaration {
  std::string help;
  bool hasHelp = false;
  Declared type = Declared::NONE;
};

// Where a line's text lies, for messages about it after it was read.
struct LineRef {
  size_t number = 0;
  kj::ArrayPtr<const char> text;
};

struct Bucket {
  double le;
  uint64_t cumulative;
};

struct Series {
  MetricLabels labels;
  LineRef first;                // where the series first appeared
  double value = 0;             // counters and gauges
  std::vector<Bucket> buckets;  // histograms: as given, in any order
  std::optional<double> sum;
  std::optional<uint64_t> count;
};

struct Family {
  std::string name;
  MetricType type = MetricType::GAUGE;
  std::string helpFrom;  // the name whose HELP line is this family's help
  std::vector<Series> series;
  std::unordered_map<std::string, size_t> index;  // by labelKey()
};

// Which part of a histogram a sample line is.
enum class Part : uint8_t { VALUE, BUCKET, SUM, COUNT };

// Where a sample line goes: its family's name, type and help, and which part of it it is.
struct Route {
  std::string family;
  MetricType type;
  std::string helpFrom;
  Part part = Part::VALUE;
};

bool isBlank(char c) { return c == ' ' || c == '\t'; }
bool isLetter(char c) { return ('a' <= c && c <= 'z') || ('A' <= c && c <= 'Z') || c == '_'; }

bool endsWith(const std::string& text, const char* suffix, size_t length) {
  return text.size() > length && text.compare(text.size() - length, length, suffix) == 0;
}

// The labels of a series as one string, the same whatever their order: sorted, each name and the
// length of its value before the value, so that no two label sets share a key.
std::string labelKey(const MetricLabels& labels) {
  std::vector<const std::pair<std::string, std::string>*> sorted;
  sorted.reserve(labels.size());
  for (auto& l : labels) sorted.push_back(&l);
  std::sort(sorted.begin(), sorted.end(), [](auto* a, auto* b) { return a->first < b->first; });
  std::string key;
  for (auto* l : sorted) {
    key += l->first;
    key += '=';
    key += std::to_string(l->second.size());
    key += ':';
    key += l->second;
  }
  return key;
}

// A position in one line.
class Cursor {
public:
  explicit Cursor(kj::ArrayPtr<const char> line) : line(line) {}

  bool atEnd() const { return pos >= line.size(); }
  char peek() const { return atEnd() ? '\0' : line[pos]; }
  void skip() { ++pos; }
  void skipBlanks() {
    while (!atEnd() && isBlank(line[pos])) ++pos;
  }
  // Metric names are [a-zA-Z_:][a-zA-Z0-9_:]*, label names the same without ':'; "" if none.
  std::string name(bool colons) {
    size_t start = pos;
    while (!atEnd()) {
      char c = line[pos];
      bool ok = isLetter(c) || (colons && c == ':') || (pos > start && isDigit(c));
      if (!ok) break;
      ++pos;
    }
    return std::string(line.begin() + start, pos - start);
  }
  // Up to the next blank or the end.
  kj::ArrayPtr<const char> token() {
    size_t start = pos;
    while (!atEnd() && !isBlank(line[pos])) ++pos;
    return line.slice(start, pos);
  }
  kj::ArrayPtr<const char> rest() { return line.slice(std::min(pos, line.size()), line.size()); }

private:
  kj::ArrayPtr<const char> line;
  size_t pos = 0;
};

class TextParser {
public:
  TextParser(kj::StringPtr text, const PrometheusTextLimits& limits) : text(text), limits(limits) {}

  MetricsSnapshot parse() {
    if (text.size() > limits.maxBytes) {
      throwError(ErrorCode::INVALID_ARGUMENT,
                 kj::str("metrics text of ", text.size(), " bytes is over the limit of ",
                         limits.maxBytes, " bytes"));
    }
    size_t start = 0;
    while (start < text.size()) {
      size_t end = start;
      while (end < text.size() && text[end] != '\n') ++end;
      auto line = text.asArray().slice(start, end);
      // Lines may end in "\r\n" as well.
      while (line.size() > 0 && line[line.size() - 1] == '\r') {
        line = line.slice(0, line.size() - 1);
      }
      current = LineRef{++lineNumber, line};
      parseLine(line);
      start = end + 1;
    }
    return finish();
  }

private:
  [[noreturn]] void fail(const LineRef& at, kj::StringPtr what) {
    throwError(ErrorCode::INVALID_ARGUMENT, kj::str("metrics text line ", at.number, ": ", what,
                                                    ": '", printable(at.text), "'"));
  }
  [[noreturn]] void fail(kj::StringPtr what) { fail(current, what); }

  void parseLine(kj::ArrayPtr<const char> line) {
    Cursor c(line);
    c.skipBlanks();
    if (c.atEnd()) return;
    if (c.peek() == '#') {
      c.skip();
      parseComment(c);
    } else {
      parseSample(c);
    }
  }

  // "# HELP name text", "# TYPE name type"; any other line starting with '#' is a comment.
  void parseComment(Cursor& c) {
    c.skipBlanks();
    auto keyword = c.token();
    bool help = keyword == kj::StringPtr("HELP").asArray();
    bool type = keyword == kj::StringPtr("TYPE").asArray();
    if (!help && !type) return;
    c.skipBlanks();
    auto name = c.name(true);
    if (name.empty()) fail(kj::str("a ", help ? "HELP" : "TYPE", " line names no metric"));
    if (!c.atEnd() && !isBlank(c.peek())) fail("a metric name has a character it cannot have");
    auto& d = declare(name);
    c.skipBlanks();
    if (help) {
      if (d.hasHelp) fail(kj::str("a second HELP line for '", name.c_str(), "'"));
      d.hasHelp = true;
      d.help = unescapeHelp(c.rest());
    } else {
      declareType(name, d, c);
    }
  }

  Declaration& declare(const std::string& name) {
    auto found = declarations.find(name);
    if (found != declarations.end()) return found->second;
    if (declarations.size() >= limits.maxSeries) {
      fail(kj::str("more than ", limits.maxSeries, " metrics are declared"));
    }
    return declarations[name];
  }

  void declareType(const std::string& name, Declaration& d, Cursor& c) {
    if (d.type != Declared::NONE) fail(kj::str("a second TYPE line for '", name.c_str(), "'"));
    auto word = c.token();
    c.skipBlanks();
    if (!c.atEnd()) fail("a TYPE line has more than a name and a type");
    auto is = [&](const char* w) { return word == kj::StringPtr(w).asArray(); };
    if (is("counter")) {
      d.type = Declared::COUNTER;
    } else if (is("gauge")) {
      d.type = Declared::GAUGE;
    } else if (is("untyped")) {
      d.type = Declared::UNTYPED;
    } else if (is("summary")) {
      d.type = Declared::SUMMARY;
    } else if (is("histogram")) {
      d.type = Declared::HISTOGRAM;
    } else {
      fail(kj::str("unknown metric type '", printable(word), "'"));
    }
    if (familyIndex.count(name) != 0) {
      fail(kj::str("the TYPE line for '", name.c_str(), "' comes after its samples"));
    }
    if (d.type == Declared::HISTOGRAM) {
      for (auto suffix : {"_bucket", "_sum", "_count"}) {
        if (familyIndex.count(name + suffix) != 0) {
          fail(kj::str("histogram '", name.c_str(), "' would take the samples of '", name.c_str(),
                       suffix, "', given before"));
        }
      }
    }
  }

  // HELP text: "\\" and "\n" are escapes, and no other.
  std::string unescapeHelp(kj::ArrayPtr<const char> raw) {
    std::string out;
    for (size_t i = 0; i < raw.size(); ++i) {
      if (raw[i] != '\\') {
        out += raw[i];
        continue;
      }
      char next = i + 1 < raw.size() ? raw[i + 1] : '\0';
      if (next == '\\') {
        out += '\\';
      } else if (next == 'n') {
        out += '\n';
      } else {
        fail("HELP text has a backslash that is not \\\\ or \\n");
      }
      ++i;
    }
    return out;
  }

  // name{labels} value [timestamp]
  void parseSample(Cursor& c) {
    auto name = c.name(true);
    if (name.empty()) fail("a sample line does not start with a metric name");
    bool blank = isBlank(c.peek());
    c.skipBlanks();
    MetricLabels labels;
    if (c.peek() == '{') {
      c.skip();
      labels = parseLabels(c);
    } else if (!blank && !c.atEnd()) {
      fail("a metric name has a character it cannot have");
    }
    c.skipBlanks();
    auto valueText = c.token();
    if (valueText.size() == 0) fail("a sample has no value");
    double value = parseNumber(valueText, "value");
    c.skipBlanks();
    auto timestamp = c.token();
    if (timestamp.size() > 0) checkTimestamp(timestamp);
    c.skipBlanks();
    if (!c.atEnd()) fail("a sample has more than a value and a timestamp");
    addSample(route(name), kj::mv(labels), value);
  }

  MetricLabels parseLabels(Cursor& c) {
    MetricLabels labels;
    for (;;) {
      c.skipBlanks();
      if (c.peek() == '}') break;
      auto label = c.name(false);
      if (label.empty()) fail("a label name is missing or has a character it cannot have");
      c.skipBlanks();
      if (c.peek() != '=') fail(kj::str("label '", label.c_str(), "' has no '='"));
      c.skip();
      c.skipBlanks();
      if (c.peek() != '"') fail(kj::str("the value of label '", label.c_str(), "' is not quoted"));
      c.skip();
      auto value = labelValue(c);
      for (auto& l : labels) {
        if (l.first == label) fail(kj::str("label '", label.c_str(), "' is given twice"));
      }
      if (labels.size() >= limits.maxLabels) {
        fail(kj::str("a series has more than ", limits.maxLabels, " labels"));
      }
      labels.emplace_back(kj::mv(label), kj::mv(value));
      c.skipBlanks();
      if (c.peek() == ',') {
        c.skip();
      } else if (c.peek() != '}') {
        fail("labels must be separated by ',' and end with '}'");
      }
    }
    c.skip();  // '}'
    return labels;
  }

  // A label value after its opening quote, up to and past its closing one: "\\", "\"" and "\n"
  // are escapes, and no other.
  std::string labelValue(Cursor& c) {
    std::string out;
    for (;;) {
      if (c.atEnd()) fail("a label value is not closed with '\"'");
      char ch = c.peek();
      c.skip();
      if (ch == '"') return out;
      if (ch != '\\') {
        out += ch;
        continue;
      }
      char next = c.peek();
      if (c.atEnd() || (next != '\\' && next != '"' && next != 'n')) {
        fail("a label value has a backslash that is not \\\\, \\\" or \\n");
      }
      c.skip();
      out += next == 'n' ? '\n' : next;
    }
  }

  double parseNumber(kj::ArrayPtr<const char> token, kj::StringPtr what) {
    // strtod would skip leading white space (form feeds, say) that the format does not allow.
    bool sane = token.size() > 0 && token.size() <= MAX_NUMBER_CHARS &&
                (isDigit(token[0]) || isLetter(token[0]) || token[0] == '+' || token[0] == '-' ||
                 token[0] == '.');
    double value = 0;
    if (sane) {
      char copy[MAX_NUMBER_CHARS + 1];  // parseAs wants the NUL after it
      memcpy(copy, token.begin(), token.size());
      copy[token.size()] = '\0';
      kj::StringPtr number(copy, token.size());
      sane = kj::runCatchingExceptions([&]() { value = number.parseAs<double>(); }) == nullptr;
    }
    if (!sane) fail(kj::str("the ", what, " '", printable(token), "' is not a number"));
    return value;
  }

  void checkTimestamp(kj::ArrayPtr<const char> token) {
    auto digits = token.size() > 0 && token[0] == '-' ? token.slice(1, token.size()) : token;
    if (parseWholeNumber(digits, INT64_MAX) == nullptr) {
      fail(kj::str("the timestamp '", printable(token), "' is not a whole number of ms"));
    }
  }

  const Declaration* declared(const std::string& name) const {
    auto found = declarations.find(name);
    return found == declarations.end() ? nullptr : &found->second;
  }

  Declared declaredType(const std::string& name) const {
    auto d = declared(name);
    return d == nullptr ? Declared::NONE : d->type;
  }

  // Which family a sample named `name` belongs to: a declared histogram's parts first, then the
  // name's own TYPE, then a declared summary's _sum and _count; else an untyped gauge.
  Route route(const std::string& name) {
    static constexpr std::pair<const char*, Part> SUFFIXES[] = {
        {"_bucket", Part::BUCKET}, {"_sum", Part::SUM}, {"_count", Part::COUNT}};
    for (auto& [suffix, part] : SUFFIXES) {
      size_t length = strlen(suffix);
      if (!endsWith(name, suffix, length)) continue;
      auto stem = name.substr(0, name.size() - length);
      auto stemType = declaredType(stem);
      if (stemType == Declared::HISTOGRAM) return Route{stem, MetricType::HISTOGRAM, stem, part};
      if (stemType == Declared::SUMMARY && part != Part::BUCKET &&
          declaredType(name) == Declared::NONE) {
        auto own = declared(name);
        return Route{name, MetricType::GAUGE, own != nullptr && own->hasHelp ? name : stem};
      }
    }
    switch (declaredType(name)) {
      case Declared::HISTOGRAM:
        fail(kj::str("a sample of histogram '", name.c_str(),
                     "' is not its _bucket, _sum or _count"));
      case Declared::COUNTER:
        return Route{name, MetricType::COUNTER, name};
      default:
        return Route{name, MetricType::GAUGE, name};
    }
  }

  Family& family(const Route& r) {
    auto found = familyIndex.find(r.family);
    if (found != familyIndex.end()) {
      auto& f = families[found->second];
      if (f.type != r.type) fail(kj::str("'", r.family.c_str(), "' is given two types"));
      return f;
    }
    familyIndex.emplace(r.family, families.size());
    families.push_back(Family{r.family, r.type, r.helpFrom, {}, {}});
    return families.back();
  }

  // The series of `f` with `labels`: found, or made (within the limits).
  Series& series(Family& f, MetricLabels labels, bool* made) {
    auto key = labelKey(labels);
    auto found = f.index.find(key);
    *made = found == f.index.end();
    if (!*made) return f.series[found->second];
    if (seriesCount >= limits.maxSeries) {
      fail(kj::str("more than ", limits.maxSeries, " series"));
    }
    if (f.series.size() >= limits.maxSeriesPerFamily) {
      fail(kj::str("more than ", limits.maxSeriesPerFamily, " series of '", f.name.c_str(), "'"));
    }
    ++seriesCount;
    f.index.emplace(kj::mv(key), f.series.size());
    f.series.push_back(Series{kj::mv(labels), current, 0, {}, {}, {}});
    return f.series.back();
  }

  void addSample(const Route& r, MetricLabels labels, double value) {
    auto& f = family(r);
    bool made = false;
    if (r.type != MetricType::HISTOGRAM) {
      auto& s = series(f, kj::mv(labels), &made);
      if (!made) fail("a series is given twice");
      s.value = value;
      return;
    }
    std::optional<double> le;
    auto at = std::find_if(labels.begin(), labels.end(), [](auto& l) { return l.first == "le"; });
    if (at != labels.end()) {
      if (r.part != Part::BUCKET) fail("a histogram's _sum and _count take no le label");
      le = parseNumber(kj::arrayPtr(at->second.data(), at->second.size()), "bucket bound");
      if (std::isnan(*le)) fail("a bucket bound is NaN");
      labels.erase(at);
    } else if (r.part == Part::BUCKET) {
      fail("a histogram bucket has no le label");
    }
    auto& s = series(f, kj::mv(labels), &made);
    addHistogramPart(s, r.part, le, value);
  }

  void addHistogramPart(Series& s, Part part, std::optional<double> le, double value) {
    if (part == Part::SUM) {
      if (s.sum) fail("a histogram's _sum is given twice");
      if (!std::isfinite(value) || std::fabs(value) > MAX_SUM_SECONDS) {
        fail("a histogram's _sum is out of range");
      }
      s.sum = value;
      return;
    }
    if (!std::isfinite(value) || value < 0 || value != std::floor(value) || value >= MAX_COUNT) {
      fail("a histogram's counts are whole numbers from 0 to 2^63");
    }
    auto n = static_cast<uint64_t>(value);
    if (part == Part::COUNT) {
      if (s.count) fail("a histogram's _count is given twice");
      s.count = n;
      return;
    }
    if (s.buckets.size() >= limits.maxBuckets) {
      fail(kj::str("a histogram has more than ", limits.maxBuckets, " buckets"));
    }
    s.buckets.push_back(Bucket{*le, n});
  }

  // Troupe's buckets from the exporter's: each of its buckets counts in the troupe bucket with
  // the nearest bound at or above its own.
  LatencyHistogram histogramOf(Series& s) {
    auto wrong = [&](const char* what) {
      fail(s.first, kj::str("the histogram series that starts here has ", what));
    };
    auto& b = s.buckets;
    std::sort(b.begin(), b.end(), [](const Bucket& x, const Bucket& y) { return x.le < y.le; });
    for (size_t i = 1; i < b.size(); ++i) {
      if (b[i].le == b[i - 1].le) wrong("a bucket given twice");
      if (b[i].cumulative < b[i - 1].cumulative) wrong("counts that decrease as le grows");
    }
    std::array<uint64_t, LATENCY_BUCKET_BOUNDS_NS.size()> cumulative{};
    size_t k = 0;
    uint64_t below = 0;
    for (size_t j = 0; j < LATENCY_BUCKET_BOUNDS_NS.size(); ++j) {
      // A bound written in a few digits reads back a hair off the exact one.
      double bound = static_cast<double>(LATENCY_BUCKET_BOUNDS_NS[j]) / 1e9 * (1 + 1e-9);
      for (; k < b.size() && b[k].le <= bound; ++k) below = b[k].cumulative;
      cumulative[j] = below;
    }
    uint64_t largest = b.empty() ? 0 : b.back().cumulative;
    bool hasInf = !b.empty() && std::isinf(b.back().le) && b.back().le > 0;
    uint64_t count = s.count ? *s.count : largest;
    if (hasInf && s.count && *s.count != largest) wrong("a _count unlike its +Inf bucket");
    if (largest > count) wrong("a _count below its buckets");

    LatencyHistogram h;
    for (size_t j = 0; j < cumulative.size(); ++j) {
      h.counts[j] = cumulative[j] - (j == 0 ? 0 : cumulative[j - 1]);
    }
    h.counts.back() = count - cumulative.back();
    h.count = count;
    h.sumNanos = s.sum ? static_cast<int64_t>(std::llround(*s.sum * 1e9)) : 0;
    return h;
  }

  std::string helpOf(const Family& f) const {
    auto d = declared(f.helpFrom);
    return d == nullptr ? std::string() : d->help;
  }

  MetricsSnapshot finish() {
    MetricsSnapshot out;
    for (auto& f : families) {
      auto helpText = helpOf(f);
      // Sized: a HELP text may hold NUL bytes, where a conversion through c_str() would stop.
      kj::StringPtr help(helpText.c_str(), helpText.size());
      for (auto& s : f.series) {
        if (f.type == MetricType::HISTOGRAM) {
          out.addHistogram(f.name, help, kj::mv(s.labels), histogramOf(s));
        } else {
          out.add(f.name, help, f.type, kj::mv(s.labels), s.value);
        }
      }
    }
    return out;
  }

  kj::StringPtr text;
  const PrometheusTextLimits& limits;
  size_t lineNumber = 0;
  LineRef current;
  std::unordered_map<std::string, Declaration> declarations;
  std::vector<Family> families;  // in the order their first samples came
  std::unordered_map<std::string, size_t> familyIndex;
  size_t seriesCount = 0;
};

}  // namespace

MetricsSnapshot parsePrometheusText(kj::StringPtr text, const PrometheusTextLimits& limits) {
  return TextParser(text, limits).parse();
}

}  // namespace troupe
