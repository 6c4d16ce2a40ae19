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

namespace troupe::resolver_detail {

namespace {

constexpr kj::StringPtr TEXT = "text/plain; charset=utf-8"_kj;
constexpr kj::StringPtr JSON = "application/json"_kj;

// How long a comment line takes to come on an event stream with nothing else to say.
constexpr kj::Duration KEEPALIVE = 15 * kj::SECONDS;

// How long the registry waits for an endpoint's /metrics, and how much of it it passes on.
constexpr kj::Duration METRICS_FETCH_TIMEOUT = 5 * kj::SECONDS;
constexpr uint64_t MAX_METRICS_BYTES = 16 << 20;

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

kj::String jobJson(const JobStatus& status) {
  capnp::MallocMessageBuilder message;
  auto b = message.initRoot<schema::JobStatus>();
  toCapnp(status, b);
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
                           std::shared_ptr<Credentials> credentials,
                           std::shared_ptr<spdlog::logger> log)
    : loop(loop),
      registry(kj::mv(table)),
      credentials(kj::mv(credentials)),
      log(kj::mv(log)),
      clientHeaders(kj::heap<kj::HttpHeaderTable>()) {
  tlsNetwork = this->credentials->clientTlsContext().wrapNetwork(loop.network());
  client = kj::newHttpClient(loop.timer(), *clientHeaders, loop.network(), *tlsNetwork);
}

RegistryHttp::~RegistryHttp() noexcept(false) {}

std::vector<std::string> RegistryHttp::publicPaths() {
  return {"/", "/index.html", "/dashboard.js", "/dashboard.css", "/favicon.ico", "/healthz"};
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
  return sendHttpText(response, table(), 404, TEXT,
                      kj::str("not found: the registry serves /, /metrics, /healthz and /api/\n"));
}

kj::Promise<void> RegistryHttp::state(Response& response) {
  kj::Vector<kj::String> jobs;
  for (auto& j : registry->jobList()) jobs.add(jobJson(j.status));
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
  std::string address;
  KJ_IF_MAYBE(e, registry->find(name)) {
    auto it = e->metadata.find("metrics");
    if (it != e->metadata.end()) metricsUrl = it->second;
    address = e->address;
  } else {
    return fail(404, kj::str("no endpoint named '", printable(name), "' is registered"));
  }
  if (metricsUrl.empty()) {
    return fail(404, kj::str("endpoint '", name,
                             "' serves no metrics (its server has no HTTP address: "
                             "ActorServerOptions::httpAddress or TROUPE_METRICS)"));
  }
  // Only the endpoint's own machine: a registrant cannot point the registry elsewhere.
  // The table keeps addresses in canonical form, so this parses.
  auto endpointAddress = Address::parse(address);
  auto host = httpUrlHost(metricsUrl);
  if (!endpointAddress.isInet() || host == nullptr ||
      KJ_ASSERT_NONNULL(host) != endpointAddress.host) {
    return fail(502,
                kj::str("endpoint '", name, "' publishes its metrics at ", printable(metricsUrl),
                        ", not on the host of its address; the registry fetches only from "
                        "an endpoint's own host"));
  }

  kj::HttpHeaders headers(*clientHeaders);
  if (credentials->hasToken()) {
    auto token = credentials->token();
    headers.add("Authorization",
                kj::str("Bearer ",
                        kj::StringPtr(reinterpret_cast<const char*>(token.begin()), token.size())));
  }
  auto target = kj::str(metricsUrl.c_str(), "/metrics");
  auto fetched = client->request(kj::HttpMethod::GET, target, headers, uint64_t{0})
                     .response
                     .then([](kj::HttpClient::Response&& r) {
                       auto read = r.body->readAllText(MAX_METRICS_BYTES);
                       uint status = r.statusCode;
                       return read.attach(kj::mv(r.body)).then([status](kj::String text) {
                         return kj::tuple(status, kj::mv(text));
                       });
                     })
                     .exclusiveJoin(loop.timer().afterDelay(METRICS_FETCH_TIMEOUT).then([]() {
                       return kj::Promise<kj::Tuple<uint, kj::String>>(
                           KJ_EXCEPTION(OVERLOADED, "no answer within 5 s"));
                     }));
  auto sent = kj::str(name);
  return fetched.then(
      [this, &response, sent = kj::mv(sent)](kj::Tuple<uint, kj::String>&& result) mutable {
        auto status = kj::get<0>(result);
        if (status != 200) {
          return sendHttpText(response, table(), 502, TEXT,
                              kj::str("endpoint '", sent, "' answered /metrics with HTTP ", status,
                                      "\n"));
        }
        return sendHttpText(response, table(), 200, "text/plain; version=0.0.4; charset=utf-8",
                            kj::mv(kj::get<1>(result)));
      },
      [this, &response, name = kj::mv(name)](kj::Exception&& e) {
        return sendHttpText(response, table(), 502, TEXT,
                            kj::str("could not fetch the metrics of '", name,
                                    "': ", errorMessage(e), "\n"));
      });
}

}  // namespace troupe::resolver_detail
