#include "troupe/resolver/detail/registry_http.h"

#include <capnp/compat/json.h>
#include <capnp/message.h>
#include <kj/compat/tls.h>
#include <kj/debug.h>
#include <kj/encoding.h>
#include <spdlog/spdlog.h>

#include "troupe/base/errors.h"
#include "troupe/net/address.h"
#include "troupe/resolver/detail/dashboard_assets.h"
#include "troupe/resolver/detail/url_query.h"
#include "troupe/resolver/registry_wire.h"
#include "troupe/schemas/dashboard.capnp.h"

namespace troupe::resolver_detail {

namespace {

constexpr kj::StringPtr TEXT = "text/plain; charset=utf-8"_kj;
constexpr kj::StringPtr JSON = "application/json"_kj;

// How long a comment line takes to come on an event stream with nothing else to say.
constexpr kj::Duration KEEPALIVE = 15 * kj::SECONDS;

// How long the registry waits for an endpoint's /metrics, and for a launcher's answers.
constexpr kj::Duration METRICS_FETCH_TIMEOUT = 5 * kj::SECONDS;
constexpr kj::Duration LAUNCHER_TIMEOUT = 5 * kj::SECONDS;

// What a job page shows of its replicas' logs: the last lines of the first replicas.
constexpr uint32_t LOG_TAIL_BYTES = 4096;
constexpr size_t LOG_TAIL_LINES = 20;
constexpr uint32_t LOG_TAIL_REPLICAS = 16;

template <typename Reader>
kj::String toJson(Reader reader) {
  capnp::JsonCodec json;
  return json.encode(reader);
}

kj::String endpointJson(const Endpoint& e) {
  capnp::MallocMessageBuilder message;
  auto b = message.initRoot<schema::Endpoint>();
  e.toCapnp(b);
  return toJson(b.asReader());
}

kj::String jobInfoJson(const JobInfo& info) {
  capnp::MallocMessageBuilder message;
  auto b = message.initRoot<schema::JobInfo>();
  toCapnp(info, b);
  return toJson(b.asReader());
}

kj::String eventJson(const WatchEvent& event) {
  capnp::MallocMessageBuilder message;
  auto b = message.initRoot<schema::WatchEvent>();
  toCapnp(event, b);
  return toJson(b.asReader());
}

// The value of `key` in the query of `url`, decoded; null when absent or badly encoded.
kj::Maybe<kj::String> queryValue(kj::StringPtr url, kj::StringPtr key) {
  KJ_IF_MAYBE(q, url.findFirst('?')) {
    for (auto& part : splitParts(url.slice(*q + 1), '&')) {
      if (part.startsWith(key) && part.size() > key.size() && part[key.size()] == '=') {
        auto decoded = kj::decodeWwwForm(part.slice(key.size() + 1));
        if (decoded.hadErrors) return nullptr;
        return kj::mv(decoded);
      }
    }
  }
  return nullptr;
}

// The last LOG_TAIL_LINES whole lines of `text`, which starts mid-line unless `whole`.
std::string lastLines(kj::StringPtr text, bool whole) {
  std::string_view rest(text.begin(), text.size());
  if (!whole) {
    auto nl = rest.find('\n');
    rest = nl == std::string_view::npos ? std::string_view() : rest.substr(nl + 1);
  }
  // Back from the end (past the last line's own newline) over LOG_TAIL_LINES newlines.
  size_t from = rest.size() > 0 && rest.back() == '\n' ? rest.size() - 1 : rest.size();
  size_t lines = 0;
  while (from > 0 && !(rest[from - 1] == '\n' && ++lines == LOG_TAIL_LINES)) --from;
  return std::string(rest.substr(from));
}

// Log bytes as text for the page: valid UTF-8 kept, newlines and tabs kept, other control
// characters and each byte of a malformed sequence shown as U+FFFD.
std::string logText(kj::ArrayPtr<const kj::byte> bytes) {
  std::string out;
  out.reserve(bytes.size());
  constexpr kj::StringPtr REPLACEMENT = "\xef\xbf\xbd"_kj;
  for (size_t i = 0; i < bytes.size();) {
    kj::byte b = bytes[i];
    if (b < 0x80) {
      bool keep = b >= 0x20 ? b != 0x7f : (b == '\n' || b == '\t');
      out += keep ? static_cast<char>(b) : '?';
      ++i;
      continue;
    }
    // The length of the sequence `b` starts, and the least code point it may hold.
    size_t n = b >= 0xf0 && b < 0xf5 ? 4 : b >= 0xe0 ? 3 : b >= 0xc2 && b < 0xe0 ? 2 : 0;
    uint32_t cp = n == 4 ? b & 0x07u : n == 3 ? b & 0x0fu : b & 0x1fu;
    bool ok = n != 0 && i + n <= bytes.size();
    for (size_t k = 1; ok && k < n; ++k) {
      ok = (bytes[i + k] & 0xc0) == 0x80;
      cp = (cp << 6) | (bytes[i + k] & 0x3fu);
    }
    ok = ok &&
         cp >= (n == 4   ? 0x10000u
                : n == 3 ? 0x800u
                         : 0x80u) &&
         cp <= 0x10ffff && (cp < 0xd800 || cp > 0xdfff);
    if (ok) {
      out.append(reinterpret_cast<const char*>(bytes.begin() + i), n);
      i += n;
    } else {
      out += REPLACEMENT.cStr();
      ++i;
    }
  }
  return out;
}

template <typename T>
kj::Promise<T> within(EventLoop& loop, kj::Promise<T> promise, kj::StringPtr what) {
  return promise.exclusiveJoin(
      loop.timer().afterDelay(LAUNCHER_TIMEOUT).then([what]() -> kj::Promise<T> {
        return makeError(ErrorCode::UNREACHABLE,
                         kj::str("the job's launcher did not answer ", what, " within 5 s"));
      }));
}

// Fills `page`'s logs with the last lines of the job's first replicas, asking `control`.
kj::Promise<void> logTails(EventLoop& loop, schema::JobControl::Client control,
                           schema::JobPage::Builder page, uint32_t replicas) {
  uint32_t shown = kj::min(replicas, LOG_TAIL_REPLICAS);
  auto out = page.initLogs(shown);
  kj::Vector<kj::Promise<void>> reads;
  for (uint32_t i = 0; i < shown; ++i) {
    auto size = control.readLogRequest();
    size.setReplica(i);
    size.setOffset(kj::maxValue);
    size.setMaxBytes(0);
    auto entry = out[i];
    entry.setReplica(i);
    reads.add(within(loop, size.send().then([control, i, entry](auto&& r) mutable {
      uint64_t total = r.getPiece().getSize();
      entry.setSize(total);
      auto tail = control.readLogRequest();
      tail.setReplica(i);
      uint64_t from = total > LOG_TAIL_BYTES ? total - LOG_TAIL_BYTES : 0;
      tail.setOffset(from);
      tail.setMaxBytes(LOG_TAIL_BYTES);
      return tail.send().then([entry, from](auto&& r) mutable {
        auto data = r.getPiece().getData();
        auto text = logText(data);
        entry.setText(lastLines(kj::StringPtr(text.c_str(), text.size()), from == 0));
      });
    }),
                     "readLog"));
  }
  return kj::joinPromises(reads.releaseAsArray());
}

void fillSeries(schema::HistorySeries::Builder b, kj::StringPtr name,
                const MetricsHistory::Series& series) {
  b.setName(name);
  auto samples = series.samples();
  auto out = b.initSamples(static_cast<uint32_t>(samples.size()));
  for (uint32_t i = 0; i < out.size(); ++i) {
    auto& s = samples[i];
    auto o = out[i];
    o.setAtMillis(s.atMillis);
    o.setCalls(s.calls);
    o.setErrors(s.errors);
    o.setP50(s.p50);
    o.setP99(s.p99);
    uint32_t codes = 0;
    for (auto& [code, rate] : s.byCode) codes += code != MetricsHistory::NO_CODE;
    auto byCode = o.initByCode(codes);
    uint32_t k = 0;
    for (auto& [code, rate] : s.byCode) {
      if (code == MetricsHistory::NO_CODE) continue;
      byCode[k].setCode(errorCodeName(static_cast<ErrorCode>(code)));
      byCode[k].setPerSecond(rate);
      ++k;
    }
  }
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// An open /api/events response: the registry pushes to its Watcher, which writes to the
// browser. Owned by the request's promise; the Watcher capability (held by the table) refers to
// it while it lives.

class EventSession;

class EventStream final : public schema::Watcher::Server {
public:
  explicit EventStream(EventSession& session) : session(session) {}
  ~EventStream() noexcept(false);

  void detach() { session = nullptr; }

protected:
  kj::Promise<void> events(EventsContext context) override;

private:
  kj::Maybe<EventSession&> session;
};

class EventSession {
public:
  EventSession(RegistryHttp& http, kj::Own<kj::AsyncOutputStream> out,
               kj::Own<kj::PromiseFulfiller<void>> done)
      : http(http),
        out(kj::mv(out)),
        done(kj::mv(done)),
        lastWrite(kj::Promise<void>(kj::READY_NOW).fork()) {
    ++http.streams;
  }

  ~EventSession() noexcept(false) {
    --http.streams;
    KJ_IF_MAYBE(s, stream) {
      s->detach();
    }
    KJ_IF_MAYBE(id, watcherId) {
      http.registry->removeWatcher(*id);
    }
  }

  KJ_DISALLOW_COPY(EventSession);

  // Subscribes to every endpoint. Throws what the table throws (OVERLOADED past maxWatchers).
  void start() {
    auto server = kj::heap<EventStream>(*this);
    stream = *server;
    watcherId = http.registry->addWatcher("", schema::Watcher::Client(kj::mv(server)));
    keepalive = keepAlive().eagerlyEvaluate(nullptr);
  }

  // Writes `text` after everything written before; ends the session when the browser has gone.
  kj::Promise<void> write(kj::String text) {
    auto next = lastWrite.addBranch()
                    .then([this, text = kj::mv(text)]() mutable {
                      auto p = out->write(text.begin(), text.size());
                      return p.attach(kj::mv(text));
                    })
                    .fork();
    auto result = next.addBranch().catch_([this](kj::Exception&& e) -> kj::Promise<void> {
      end();
      return kj::mv(e);
    });
    lastWrite = kj::mv(next);
    return result;
  }

  // The table let go of the watcher (it fell behind, or the registry stopped): the browser
  // reconnects and starts over.
  void watcherGone() {
    stream = nullptr;
    watcherId = nullptr;
    end();
  }

  void end() {
    if (done->isWaiting()) done->fulfill();
  }

private:
  kj::Promise<void> keepAlive() {
    return http.loop.timer().afterDelay(KEEPALIVE).then([this]() {
      return write(kj::str(": keepalive\n\n")).then([this]() { return keepAlive(); });
    });
  }

  RegistryHttp& http;
  kj::Own<kj::AsyncOutputStream> out;
  kj::Own<kj::PromiseFulfiller<void>> done;
  kj::ForkedPromise<void> lastWrite;
  kj::Maybe<EventStream&> stream;
  kj::Maybe<uint64_t> watcherId;
  kj::Promise<void> keepalive = nullptr;
};

EventStream::~EventStream() noexcept(false) {
  KJ_IF_MAYBE(s, session) {
    s->watcherGone();
  }
}

kj::Promise<void> EventStream::events(EventsContext context) {
  KJ_IF_MAYBE(s, session) {
    kj::Vector<kj::String> lines;
    for (auto e : context.getParams().getEvents()) {
      KJ_IF_MAYBE(event, fromCapnp(e)) {
        lines.add(kj::str("data: ", eventJson(*event), "\n\n"));
      }
    }
    return s->write(kj::strArray(lines, ""));
  }
  return KJ_EXCEPTION(DISCONNECTED, "the browser's event stream has closed");
}

// ---------------------------------------------------------------------------------------------

RegistryHttp::RegistryHttp(EventLoop& loop, kj::Own<RegistryTable> table,
                           std::shared_ptr<Credentials> credentials, HistoryOptions history,
                           std::shared_ptr<spdlog::logger> log)
    : loop(loop),
      registry(kj::mv(table)),
      credentials(kj::mv(credentials)),
      log(kj::mv(log)),
      reader(loop, *registry, this->credentials, history, this->log) {}

RegistryHttp::~RegistryHttp() noexcept(false) {}

std::vector<std::string> RegistryHttp::publicPaths() {
  return {"/",       "/index.html",    "/dashboard.js", "/charts.js",
          "/job.js", "/dashboard.css", "/favicon.ico",  "/healthz"};
}

const kj::HttpHeaderTable& RegistryHttp::table() const {
  return KJ_ASSERT_NONNULL(endpoint).headerTable();
}

kj::Promise<void> RegistryHttp::request(kj::HttpMethod, kj::StringPtr url, const kj::HttpHeaders&,
                                        kj::AsyncInputStream&, Response& response) {
  auto path = url.slice(0, url.findFirst('?').orDefault(url.size()));
  for (auto& asset : dashboardAssets()) {
    if (path == asset.path || (path == "/"_kj && asset.path == "/index.html"_kj)) {
      kj::HttpHeaders headers(table());
      headers.set(kj::HttpHeaderId::CONTENT_TYPE, asset.contentType);
      headers.add("Cache-Control", "no-store");
      headers.add("X-Content-Type-Options", "nosniff");
      // Scripts and styles from the registry itself only; nothing inline, nothing elsewhere.
      headers.add("Content-Security-Policy",
                  "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
                  "img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'");
      auto stream = response.send(200, "OK", headers, asset.body.size());
      auto write = stream->write(asset.body.begin(), asset.body.size());
      return write.attach(kj::mv(stream));
    }
  }
  if (path == "/healthz"_kj) return sendHttpText(response, table(), 200, TEXT, kj::str("ok\n"));
  if (path == "/favicon.ico"_kj) {
    // No icon, said so without an error in the browser's console.
    kj::HttpHeaders headers(table());
    response.send(204, "No Content", headers, uint64_t{0});
    return kj::READY_NOW;
  }
  if (path == "/api/state"_kj) return state(response);
  if (path == "/api/events"_kj) return events(response);
  if (path == "/api/metrics"_kj) return endpointMetrics(url, response);
  if (path == "/api/history"_kj) return history(url, response);
  if (path == "/api/job"_kj) return jobPage(url, response);
  return sendHttpText(response, table(), 404, TEXT,
                      kj::str("not found: the registry serves /, /metrics, /healthz and /api/\n"));
}

kj::Promise<void> RegistryHttp::state(Response& response) {
  kj::Vector<kj::String> jobs;
  for (auto& j : registry->jobList()) jobs.add(jobInfoJson(j));
  kj::Vector<kj::String> endpoints;
  for (auto& e : registry->resolve("")) endpoints.add(endpointJson(e));
  auto body = kj::str("{\"jobs\":[", kj::strArray(jobs, ","), "],\"endpoints\":[",
                      kj::strArray(endpoints, ","), "]}\n");
  return sendHttpText(response, table(), 200, JSON, kj::mv(body));
}

kj::Promise<void> RegistryHttp::events(Response& response) {
  kj::HttpHeaders headers(table());
  headers.set(kj::HttpHeaderId::CONTENT_TYPE, "text/event-stream");
  headers.add("Cache-Control", "no-store");
  auto paf = kj::newPromiseAndFulfiller<void>();
  auto session = kj::heap<EventSession>(*this, response.send(200, "OK", headers),
                                        kj::mv(paf.fulfiller));
  KJ_IF_MAYBE(e, kj::runCatchingExceptions([&]() { session->start(); })) {
    log->warn("refused a dashboard event stream: {}", e->getDescription().cStr());
    return session->write(kj::str("event: refused\ndata: ", printable(errorMessage(*e)), "\n\n"))
        .attach(kj::mv(session));
  }
  return paf.promise.attach(kj::mv(session));
}

kj::Promise<void> RegistryHttp::endpointMetrics(kj::StringPtr url, Response& response) {
  auto fail = [&](uint status, kj::String message) {
    return sendHttpText(response, table(), status, TEXT, kj::str(message, "\n"));
  };
  kj::String name;
  KJ_IF_MAYBE(n, queryValue(url, "endpoint")) {
    name = kj::mv(*n);
  } else {
    return fail(400, kj::str("say which endpoint: /api/metrics?endpoint=<job>/<actor>-<index>"));
  }
  std::string metricsUrl;
  KJ_IF_MAYBE(e, registry->find(name)) {
    KJ_IF_MAYBE(error, kj::runCatchingExceptions([&]() { metricsUrl = metricsUrlOf(*e); })) {
      return fail(errorCode(*error) == ErrorCode::UNIMPLEMENTED ? 404 : 502,
                  kj::str(errorMessage(*error)));
    }
  } else {
    return fail(404, kj::str("no endpoint named '", printable(name), "' is registered"));
  }
  return reader.fetch(metricsUrl, METRICS_FETCH_TIMEOUT)
      .then(
          [this, &response](kj::String text) {
            return sendHttpText(response, table(), 200, "text/plain; version=0.0.4; charset=utf-8",
                                kj::mv(text));
          },
          [this, &response, name = kj::mv(name)](kj::Exception&& e) {
            return sendHttpText(response, table(), 502, TEXT,
                                kj::str("could not fetch the metrics of '", name,
                                        "': ", errorMessage(e), "\n"));
          });
}

kj::Promise<void> RegistryHttp::history(kj::StringPtr url, Response& response) {
  auto& h = reader.history();
  capnp::MallocMessageBuilder message;
  auto root = message.initRoot<schema::History>();
  root.setIntervalMillis(static_cast<uint32_t>(h.options().interval / kj::MILLISECONDS));
  root.setLengthMillis(static_cast<uint32_t>(h.options().length / kj::MILLISECONDS));
  root.setNowMillis((loop.calendarNow() - kj::UNIX_EPOCH) / kj::MILLISECONDS);
  root.setRefused(static_cast<uint32_t>(h.refused()));
  KJ_IF_MAYBE(job, queryValue(url, "job")) {
    if (auto* series = h.job(*job)) fillSeries(root.initJobs(1)[0], *job, *series);
    kj::Vector<std::pair<kj::StringPtr, const MetricsHistory::Series*>> of;
    for (auto& [name, series] : h.endpoints()) {
      if (series.jobId == std::string_view(job->begin(), job->size())) {
        of.add(kj::StringPtr(name.c_str(), name.size()), &series);
      }
    }
    auto out = root.initEndpoints(static_cast<uint32_t>(of.size()));
    for (uint32_t i = 0; i < out.size(); ++i) fillSeries(out[i], of[i].first, *of[i].second);
  } else {
    auto out = root.initJobs(static_cast<uint32_t>(h.jobs().size()));
    uint32_t i = 0;
    for (auto& [name, series] : h.jobs()) {
      fillSeries(out[i++], kj::StringPtr(name.c_str(), name.size()), series);
    }
  }
  return sendHttpText(response, table(), 200, JSON, kj::str(toJson(root.asReader()), "\n"));
}

// A job's page: what the registry knows (its entry, events, where its logs lie) at once, then
// what its launcher says (replicas, resources, the logs' last lines) when one answers.
kj::Promise<void> RegistryHttp::jobPage(kj::StringPtr url, Response& response) {
  kj::String jobId;
  KJ_IF_MAYBE(j, queryValue(url, "job")) {
    jobId = kj::mv(*j);
  } else {
    return sendHttpText(response, table(), 400, TEXT,
                        kj::str("say which job: /api/job?job=<job>\n"));
  }
  auto message = kj::heap<capnp::MallocMessageBuilder>();
  auto root = message->initRoot<schema::JobPage>();
  KJ_IF_MAYBE(info, registry->jobInfo(jobId)) {
    toCapnp(*info, root.initJob());
  } else {
    return sendHttpText(response, table(), 404, TEXT,
                        kj::str("the registry knows no job named '", printable(jobId), "'\n"));
  }
  auto events = registry->jobEvents(jobId);
  auto out = root.initEvents(static_cast<uint32_t>(events.size()));
  for (uint32_t i = 0; i < out.size(); ++i) {
    out[i].setAtMillis(events[i].atMillis);
    out[i].setText(events[i].text);
  }
  root.setLogLocation(registry->logLocation(jobId));

  if (root.getJob().getLauncher().size() == 0) {
    root.setDetailError(
        "no launcher created this job (its replicas were started by hand): the registry knows "
        "only its endpoints");
    return sendHttpText(response, table(), 200, JSON, kj::str(toJson(root.asReader()), "\n"));
  }
  schema::JobControl::Client control = nullptr;
  KJ_IF_MAYBE(e, kj::runCatchingExceptions(
                     [&]() { control = registry->controlToRead(jobId.cStr()); })) {
    root.setDetailError(errorMessage(*e));
    return sendHttpText(response, table(), 200, JSON, kj::str(toJson(root.asReader()), "\n"));
  }
  auto pageRoot = root;
  auto described = within(loop, control.describeRequest().send().then([pageRoot](auto&& r) mutable {
    pageRoot.setDetail(r.getJob());
    return r.getJob().getReplicas().size();
  }),
                          "describe");
  auto logs = described.then([this, control, pageRoot](uint32_t replicas) mutable {
    return logTails(loop, control, pageRoot, replicas);
  });
  auto id = kj::str(jobId);
  return logs
      .catch_([this, pageRoot, id = kj::mv(id)](kj::Exception&& e) mutable {
        if (e.getType() == kj::Exception::Type::DISCONNECTED) {
          pageRoot.setDetailError(registry->controlLost(id.cStr()));
        } else {
          pageRoot.setDetailError(errorMessage(e));
        }
      })
      .then([this, &response, pageRoot]() {
        return sendHttpText(response, table(), 200, JSON,
                            kj::str(toJson(pageRoot.asReader()), "\n"));
      })
      .attach(kj::mv(message));
}

}  // namespace troupe::resolver_detail
