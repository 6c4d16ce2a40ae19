// troupe top PREFIX: a live table of the members under PREFIX, read from their /metrics.

#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include <kj/compat/http.h>
#include <kj/debug.h>

#include "troupe/base/errors.h"
#include "troupe/base/event_loop.h"
#include "troupe/base/metrics.h"
#include "troupe/net/address.h"
#include "troupe/net/credentials.h"
#include "troupe/observe/http_endpoint.h"
#include "troupe/observe/metrics_text.h"
#include "troupe/resolver/open_resolver.h"
#include "tools/troupe/cli.h"
#include "tools/troupe/commands.h"

namespace troupe::cli {

namespace {

// How long one member's /metrics may take to answer.
constexpr kj::Duration FETCH_TIMEOUT = 2 * kj::SECONDS;
// The most of a member's /metrics that is read (parsePrometheusText's own limit).
constexpr uint64_t MAX_METRICS_BYTES = 16 * 1024 * 1024;
// --interval bounds.
constexpr kj::Duration MIN_INTERVAL = 10 * kj::MILLISECONDS;
constexpr kj::Duration MAX_INTERVAL = 24 * kj::HOURS;
// Errors shown in a row are cut to this many bytes.
constexpr size_t MAX_ERROR_CHARS = 72;

// What a member's row shows, read from one scrape of its server's metrics: its series (job and
// actor its endpoint's) summed over methods.
struct Totals {
  double calls = 0;   // finished, whatever their outcome
  double errors = 0;  // finished with an error code (not "ok", not "cancelled")
  double inFlight = 0;
  LatencyHistogram latency;
};

bool includes(const MetricLabels& labels, const MetricLabels& wanted) {
  for (auto& w : wanted) {
    if (std::find(labels.begin(), labels.end(), w) == labels.end()) return false;
  }
  return true;
}

MetricLabels with(MetricLabels labels, const char* name, const char* value) {
  labels.emplace_back(name, value);
  return labels;
}

Totals totalsOf(const MetricsSnapshot& m, const Endpoint& e) {
  MetricLabels who = {{"job", e.jobId}, {"actor", e.actor}};
  Totals t;
  t.calls = m.sum("troupe_calls_total", who);
  t.errors = t.calls - m.sum("troupe_calls_total", with(who, "code", "ok")) -
             m.sum("troupe_calls_total", with(who, "code", "cancelled"));
  t.inFlight = m.sum("troupe_calls_in_flight", who);
  if (auto f = m.family("troupe_call_duration_seconds")) {
    for (auto& s : f->samples) {
      if (includes(s.labels, who)) t.latency.add(s.histogram);
    }
  }
  return t;
}

// Why a member's metrics are not fetched from `url`, or null when they may be: only from the
// member's own host, as the registry's dashboard does, so that a registrant cannot have the
// cluster token sent elsewhere.
kj::Maybe<std::string> refusedUrl(const Endpoint& e, const std::string& url) {
  Address address;
  bool inet = false;
  if (kj::runCatchingExceptions([&]() {
        address = Address::parse(e.address.c_str());
        inet = address.isInet();
      }) != nullptr) {
    inet = false;
  }
  auto host = httpUrlHost(url.c_str());
  if (host == nullptr) return std::string("error: bad metrics URL '") + printable(url).cStr() + "'";
  if (!inet || KJ_ASSERT_NONNULL(host) != address.host) {
    return std::string("error: metrics URL not on the endpoint's host: ") + printable(url).cStr();
  }
  return nullptr;
}

// "Bearer <token>". Throws, without saying the token, when it has bytes a header cannot carry
// (kj's own refusal would quote it).
kj::String bearer(kj::ArrayPtr<const kj::byte> token) {
  for (auto b : token) {
    if (b < 0x20 || b == 0x7f) {
      throwError(ErrorCode::INVALID_ARGUMENT,
                 "the cluster token has bytes an HTTP header cannot carry");
    }
  }
  return kj::str("Bearer ",
                 kj::arrayPtr(reinterpret_cast<const char*>(token.begin()), token.size()));
}

std::string shortError(const kj::Exception& e) {
  std::string text = printable(errorMessage(e)).cStr();
  if (text.size() > MAX_ERROR_CHARS) text = text.substr(0, MAX_ERROR_CHARS - 3) + "...";
  return text;
}

std::string formatNumber(const char* format, double value) {
  char text[48];
  snprintf(text, sizeof(text), format, value);
  return text;
}

// Milliseconds, to three significant digits or so.
std::string formatMillis(double seconds) {
  double ms = seconds * 1000;
  return formatNumber(ms < 10 ? "%.3f" : ms < 1000 ? "%.1f" : "%.0f", ms);
}

// `now` minus `before`, or `now` itself when the counter went back (its process restarted).
double delta(double now, double before) { return now >= before ? now - before : now; }

// One scrape: what it said and when it was answered.
struct Scrape {
  Totals totals;
  kj::TimePoint at;
};

// A member under the prefix: its endpoint as the watch last said, its last two scrapes, and
// the fetch under way.
struct Member {
  Endpoint endpoint;
  std::string url;      // its "metrics" metadata; "" when its server serves none
  std::string refused;  // why its metrics are not fetched; "" when they are
  kj::Maybe<Scrape> latest;
  kj::Maybe<Scrape> previous;
  std::string error;  // why the last fetch failed; "" when it worked
  bool fetching = false;
  uint64_t round = 0;                    // the refresh that started the fetch under way
  kj::Promise<void> inFlight = nullptr;  // dropping it cancels the fetch
};

struct TopOptions {
  std::string prefix;
  kj::Duration interval = 1 * kj::SECONDS;
  uint64_t iterations = 0;  // 0: until interrupted
};

// The view: members kept current by the resolver's watch; every interval, their metrics fetched
// in parallel and a screen printed. Belongs to `loop`; dropping it cancels everything under way.
class Top {
public:
  Top(EventLoop& loop, Resolver& resolver, TopOptions options)
      : loop(loop),
        resolver(resolver),
        options(kj::mv(options)),
        table(kj::heap<kj::HttpHeaderTable>()),
        tlsNetwork(loopCredentials(loop)->clientTlsContext().wrapNetwork(loop.network())),
        client(kj::newHttpClient(loop.timer(), *table, loop.network(), *tlsNetwork)) {}

  // Resolves after `iterations` screens; never, for 0. Rejects when the resolver fails.
  kj::Promise<void> run() {
    // The endpoints first, so that an unreachable resolver or a bad prefix is said at once.
    return resolver.resolve(options.prefix.c_str()).then([this](kj::Array<Endpoint>) {
      watch = resolver.watch(options.prefix.c_str());
      auto synced = kj::newPromiseAndFulfiller<void>();
      whenSynced = kj::mv(synced.fulfiller);
      auto screens = synced.promise.then([this]() { return refresh(); });
      return follow().exclusiveJoin(kj::mv(screens));
    });
  }

private:
  kj::Promise<void> follow() {
    return watch->next().then([this](WatchEvent event) {
      apply(event);
      return follow();
    });
  }

  void apply(const WatchEvent& event) {
    auto& e = event.endpoint;
    switch (event.type) {
      case WatchEvent::Type::ADDED:
      case WatchEvent::Type::CHANGED:
        update(e);
        break;
      case WatchEvent::Type::REMOVED:
        members.erase(e.name);
        checkRound();
        break;
      case WatchEvent::Type::SYNCED:
        KJ_IF_MAYBE(f, whenSynced) {
          (*f)->fulfill();
          whenSynced = nullptr;
        }
        break;
      case WatchEvent::Type::JOB_ENDED:
        break;  // its endpoints were REMOVED before
    }
  }

  void update(const Endpoint& e) {
    std::string url = metadataOf(e, "metrics");
    auto found = members.find(e.name);
    if (found != members.end() && found->second.endpoint.incarnation == e.incarnation &&
        found->second.url == url) {
      found->second.endpoint = e;  // a new state: the scrapes still count
      return;
    }
    // New, restarted or moved: a fresh row (dropping the old one cancels its fetch).
    Member m;
    m.endpoint = e;
    m.url = url;
    if (!url.empty()) {
      KJ_IF_MAYBE(why, refusedUrl(e, url)) {
        m.refused = kj::mv(*why);
      }
    }
    members.erase(e.name);
    members.emplace(e.name, kj::mv(m));
    checkRound();
  }

  // Starts a fetch of every member not still fetching, waits until they are answered (or an
  // interval has passed: those answer on a later screen; the first screen waits for every first
  // answer, or its timeout), prints the screen, and goes on.
  kj::Promise<void> refresh() {
    auto started = loop.timer().now();
    ++round;
    for (auto& [name, m] : members) {
      if (m.fetching || m.url.empty() || !m.refused.empty()) continue;
      m.fetching = true;
      m.round = round;
      m.inFlight = scrape(m).eagerlyEvaluate(nullptr);
    }
    auto answered = kj::newPromiseAndFulfiller<void>();
    roundDone = kj::mv(answered.fulfiller);
    checkRound();
    auto patience = screens == 0 ? std::max(options.interval, FETCH_TIMEOUT) : options.interval;
    return answered.promise.exclusiveJoin(loop.timer().afterDelay(patience))
        .then([this, started]() -> kj::Promise<void> {
          print();
          ++screens;
          if (options.iterations != 0 && screens >= options.iterations) return kj::READY_NOW;
          return loop.timer().atTime(started + options.interval).then([this]() {
            return refresh();
          });
        });
  }

  void checkRound() {
    KJ_IF_MAYBE(f, roundDone) {
      for (auto& [name, m] : members) {
        if (m.fetching && m.round == round) return;
      }
      (*f)->fulfill();
      roundDone = nullptr;
    }
  }

  // Fetches `m`'s metrics into it. Never rejects.
  kj::Promise<void> scrape(Member& m) {
    return fetch(m.url)
        .then([this, &m](kj::String text) {
          Scrape s{totalsOf(parsePrometheusText(text), m.endpoint), loop.timer().now()};
          m.previous = kj::mv(m.latest);
          m.latest = kj::mv(s);
          m.error.clear();
        })
        .catch_([&m](kj::Exception&& e) { m.error = "error: " + shortError(e); })
        .then([this, &m]() {
          m.fetching = false;
          checkRound();
        });
  }

  // The text of `url`/metrics, with the cluster token when this process has one.
  kj::Promise<kj::String> fetch(const std::string& url) {
    auto request = kj::evalNow([&]() {
      kj::HttpHeaders headers(*table);
      auto& credentials = *loopCredentials(loop);
      if (credentials.hasToken()) headers.add("Authorization", bearer(credentials.token()));
      auto target = kj::str(url.c_str(), "/metrics");
      return client->request(kj::HttpMethod::GET, target, headers, uint64_t{0})
          .response.then([](kj::HttpClient::Response&& r) -> kj::Promise<kj::String> {
            if (r.statusCode != 200) {
              return makeError(ErrorCode::FAILED,
                               kj::str("HTTP ", r.statusCode,
                                       r.statusCode == 401 ? " (no or a wrong token)" : ""));
            }
            auto read = r.body->readAllText(MAX_METRICS_BYTES);
            return read.attach(kj::mv(r.body));
          });
    });
    auto late = loop.timer().afterDelay(FETCH_TIMEOUT).then([]() -> kj::Promise<kj::String> {
      return makeError(ErrorCode::DEADLINE_EXCEEDED, "no answer within 2 s");
    });
    return request.exclusiveJoin(kj::mv(late));
  }

  std::vector<std::string> row(const Member& m) const {
    std::vector<std::string> r = {m.endpoint.name, toString(m.endpoint.state).cStr()};
    auto message = [&](std::string text) {
      r.push_back(kj::mv(text));
      return r;
    };
    if (m.url.empty()) return message("no metrics (TROUPE_METRICS unset)");
    if (!m.refused.empty()) return message(m.refused);
    if (!m.error.empty()) return message(m.error);
    KJ_IF_MAYBE(latest, m.latest) {
      auto& now = latest->totals;
      KJ_IF_MAYBE(before, m.previous) {
        double seconds = (latest->at - before->at) / kj::NANOSECONDS / 1e9;
        auto recent = since(now.latency, before->totals.latency);
        bool timed = recent.count > 0 && seconds > 0;
        r.push_back(seconds > 0
                        ? formatNumber("%.1f", delta(now.calls, before->totals.calls) / seconds)
                        : "-");
        r.push_back(timed ? formatMillis(recent.quantileSeconds(0.5)) : "-");
        r.push_back(timed ? formatMillis(recent.quantileSeconds(0.99)) : "-");
        r.push_back(seconds > 0
                        ? formatNumber("%.1f", delta(now.errors, before->totals.errors) / seconds)
                        : "-");
      } else {
        // The first answer: no rates yet, and the latency of every call so far.
        bool timed = now.latency.count > 0;
        r.push_back("-");
        r.push_back(timed ? formatMillis(now.latency.quantileSeconds(0.5)) : "-");
        r.push_back(timed ? formatMillis(now.latency.quantileSeconds(0.99)) : "-");
        r.push_back("-");
      }
      r.push_back(formatNumber("%.0f", now.errors));
      r.push_back(formatNumber("%.0f", now.inFlight));
      return r;
    }
    return message("...");  // no answer yet
  }

  void print() {
    std::vector<std::vector<std::string>> rows = {
        {"NAME", "STATE", "CALLS/S", "P50(ms)", "P99(ms)", "ERR/S", "ERRORS", "INFLIGHT"}};
    for (auto& [name, m] : members) rows.push_back(row(m));
    std::vector<size_t> widths(rows[0].size(), 0);
    for (auto& r : rows) {
      // A message in place of the numbers (a row of three) does not widen their columns.
      size_t columns = r.size() < rows[0].size() ? r.size() - 1 : r.size();
      for (size_t i = 0; i < columns; ++i) widths[i] = std::max(widths[i], r[i].size());
    }
    std::string out = terminal ? "\x1b[H\x1b[2J" : "";  // home, clear
    out += header() + "\n";
    for (auto& r : rows) {
      for (size_t i = 0; i + 1 < r.size(); ++i) {
        out += r[i] + std::string(widths[i] - r[i].size() + 2, ' ');
      }
      out += r.back() + "\n";
    }
    if (members.empty()) out += "(no endpoints)\n";
    fputs(out.c_str(), stdout);
    fflush(stdout);
  }

  // "troupe top ps/  3 members  14:02:07"
  std::string header() const {
    auto seconds = static_cast<time_t>((loop.calendarNow() - kj::UNIX_EPOCH) / kj::SECONDS);
    struct tm local;
    char clock[16] = "";
    if (localtime_r(&seconds, &local) != nullptr) {
      strftime(clock, sizeof(clock), "%H:%M:%S", &local);
    }
    return "troupe top " + options.prefix + "  " + std::to_string(members.size()) +
           (members.size() == 1 ? " member  " : " members  ") + clock;
  }

  EventLoop& loop;
  Resolver& resolver;
  TopOptions options;
  bool terminal = stdoutIsTerminal();
  kj::Own<kj::HttpHeaderTable> table;
  kj::Own<kj::Network> tlsNetwork;  // for members that serve HTTPS
  kj::Own<kj::HttpClient> client;
  kj::Own<Watch> watch;
  kj::Maybe<kj::Own<kj::PromiseFulfiller<void>>> whenSynced;
  kj::Maybe<kj::Own<kj::PromiseFulfiller<void>>> roundDone;
  uint64_t round = 0;
  uint64_t screens = 0;
  std::map<std::string, Member> members;  // by name, as printed
};

class TopCommand final : public Command {
public:
  kj::MainFunc parser(kj::ProcessContext& context) override {
    return credentialFlags
        .addTo(
            kj::MainBuilder(
                context, VERSION_TEXT,
                "Shows the endpoints whose names start with PREFIX, refreshed every interval, "
                "with what their servers' /metrics say of each one's calls: calls per second, "
                "the median and 99th percentile latency over the interval (ms), errors per "
                "second, errors in all, and calls in flight. The first screen has totals and '-' "
                "for rates. A member whose server serves no metrics (TROUPE_METRICS unset) says "
                "so; one that cannot be reached shows why. On a terminal the screen is redrawn in "
                "place, and q quits; otherwise one block per refresh is printed. Runs until "
                "interrupted, or "
                "for --iterations refreshes.")
                .addOptionWithArg(
                    {"interval"},
                    [this](kj::StringPtr text) {
                      options.interval = parseDuration("--interval", text, MIN_INTERVAL,
                                                       MAX_INTERVAL);
                      return true;
                    },
                    "DURATION", "Time between refreshes (default 1s).")
                .addOptionWithArg(
                    {"iterations"},
                    [this](kj::StringPtr text) {
                      options.iterations = parseWhole("--iterations", text);
                      return true;
                    },
                    "N", "Stop after N refreshes (default 0: until interrupted).")
                .addOptionWithArg({"resolver"}, storeIn(resolver), "URL",
                                  "Default: $TROUPE_RESOLVER.")
                .expectArg("PREFIX", storeIn(options.prefix)))
        .build();
  }

  int run() override {
    CommandLoop command(credentialFlags);
    auto& loop = command.loop;
    Top top(loop, command.resolver(resolver), options);
    auto stopped = loop.onSignal({SIGINT, SIGTERM}).ignoreResult();
    // On a terminal, q quits as well: keys are read one at a time, without echo, until then.
    kj::Maybe<termios> saved;
    kj::Own<kj::AsyncInputStream> keys;
    if (stdoutIsTerminal() && isatty(STDIN_FILENO) == 1) {
      termios t;
      if (tcgetattr(STDIN_FILENO, &t) == 0) {
        saved = t;
        t.c_lflag &= ~static_cast<tcflag_t>(ICANON | ECHO);
        t.c_cc[VMIN] = 1;
        t.c_cc[VTIME] = 0;
        tcsetattr(STDIN_FILENO, TCSANOW, &t);
        savedFlags = fcntl(STDIN_FILENO, F_GETFL);  // wrapping makes it non-blocking
        keys = loop.lowLevelIo().wrapInputFd(STDIN_FILENO);
        stopped = stopped.exclusiveJoin(untilQuit(*keys));
      }
    }
    // The terminal is the shell's again afterwards, as it was.
    KJ_DEFER(KJ_IF_MAYBE(t, saved) {
      keys = nullptr;
      tcsetattr(STDIN_FILENO, TCSANOW, t);
      if (savedFlags >= 0) fcntl(STDIN_FILENO, F_SETFL, savedFlags);
    });
    top.run().exclusiveJoin(kj::mv(stopped)).wait(loop.waitScope());
    return 0;
  }

  // Resolves when `keys` gives a 'q' (or 'Q'), or ends.
  kj::Promise<void> untilQuit(kj::AsyncInputStream& keys) {
    return keys.tryRead(&key, 1, 1).then([this, &keys](size_t n) -> kj::Promise<void> {
      if (n == 0 || key == 'q' || key == 'Q') return kj::READY_NOW;
      return untilQuit(keys);
    });
  }

private:
  TopOptions options;
  std::string resolver;
  CredentialFlags credentialFlags;
  char key = 0;
  int savedFlags = -1;
};

}  // namespace

kj::Own<Command> topCommand() { return kj::heap<TopCommand>(); }

}  // namespace troupe::cli
