#include "troupe/resolver/detail/metrics_reader.h"

#include <map>
#include <vector>

#include <kj/debug.h>
#include <spdlog/spdlog.h>

#include "troupe/base/errors.h"
#include "troupe/net/address.h"
#include "troupe/observe/http_endpoint.h"
#include "troupe/observe/metrics_text.h"

namespace troupe::resolver_detail {

namespace {

// How much of an endpoint's /metrics the registry reads.
constexpr uint64_t MAX_METRICS_BYTES = 16 << 20;

// The most a history read may take, however long the interval.
constexpr kj::Duration MAX_READ_TIME = 5 * kj::SECONDS;

// An endpoint read in a round: its name, job and actor.
struct Reader {
  std::string name;
  std::string jobId;
  std::string actor;
};

}  // namespace

std::string metricsUrlOf(const Endpoint& e) {
  auto url = metadataOf(e, "metrics");
  if (url.empty()) {
    throwError(ErrorCode::UNIMPLEMENTED,
               kj::str("endpoint '", e.name,
                       "' serves no metrics (its server has no HTTP address: "
                       "ActorServerOptions::httpAddress or TROUPE_METRICS)"));
  }
  // The table keeps addresses in canonical form, so this parses.
  auto address = Address::parse(e.address);
  auto host = httpUrlHost(url);
  if (!address.isInet() || host == nullptr || KJ_ASSERT_NONNULL(host) != address.host) {
    throwError(ErrorCode::INVALID_ARGUMENT,
               kj::str("endpoint '", e.name, "' publishes its metrics at ", printable(url),
                       ", not on the host of its address; the registry fetches only from an "
                       "endpoint's own host"));
  }
  return url;
}

MetricsReader::MetricsReader(EventLoop& loop, RegistryTable& table,
                             std::shared_ptr<Credentials> credentials, HistoryOptions options,
                             std::shared_ptr<spdlog::logger> log)
    : loop(loop),
      table(table),
      credentials(kj::mv(credentials)),
      log(kj::mv(log)),
      headers(kj::heap<kj::HttpHeaderTable>()),
      history_(options) {
  tlsNetwork = this->credentials->clientTlsContext().wrapNetwork(loop.network());
  client = kj::newHttpClient(loop.timer(), *headers, loop.network(), *tlsNetwork);
  if (options.interval > 0 * kj::SECONDS) {
    // Ends when the registry shuts its table down (resolve() throws DISCONNECTED then).
    rounds = round().eagerlyEvaluate([this](kj::Exception&& e) {
      this->log->debug("history: stopped: {}", errorMessage(e).cStr());
    });
  }
}

MetricsReader::~MetricsReader() noexcept(false) {}

kj::Promise<kj::String> MetricsReader::fetch(kj::StringPtr url, kj::Duration timeout) {
  kj::HttpHeaders request(*headers);
  if (credentials->hasToken()) {
    auto token = credentials->token();
    request.add("Authorization",
                kj::str("Bearer ",
                        kj::StringPtr(reinterpret_cast<const char*>(token.begin()), token.size())));
  }
  auto target = kj::str(url, "/metrics");
  return client->request(kj::HttpMethod::GET, target, request, uint64_t{0})
      .response
      .then([](kj::HttpClient::Response&& r) -> kj::Promise<kj::String> {
        if (r.statusCode != 200) {
          return makeError(ErrorCode::FAILED,
                           kj::str("it answered /metrics with HTTP ", r.statusCode));
        }
        auto read = r.body->readAllText(MAX_METRICS_BYTES);
        return read.attach(kj::mv(r.body));
      })
      .exclusiveJoin(loop.timer().afterDelay(timeout).then([timeout]() -> kj::Promise<kj::String> {
        return makeError(ErrorCode::OVERLOADED, kj::str("no answer within ", timeout));
      }));
}

kj::Promise<void> MetricsReader::round() {
  auto& options = history_.options();
  auto next = loop.timer().afterDelay(options.interval);
  // Each server once: its URL, and the endpoints (actors) it hosts.
  std::map<std::string, std::vector<Reader>> servers;
  for (auto& e : table.resolve("")) {
    std::string url;
    if (kj::runCatchingExceptions([&]() { url = metricsUrlOf(e); }) != nullptr) continue;
    servers[url].push_back({e.name, e.jobId, e.actor});
  }
  auto timeout = kj::min(options.interval, MAX_READ_TIME);
  kj::Vector<kj::Promise<void>> reads;
  auto texts = kj::heap<std::map<std::string, MetricsSnapshot>>();
  for (auto& [url, _] : servers) {
    auto& out = *texts;
    std::string key = url;
    reads.add(fetch(url, timeout)
                  .then([&out, key](kj::String text) { out[key] = parsePrometheusText(text); })
                  .catch_([this, key](kj::Exception&& e) {
                    log->debug("history: could not read the metrics at {}: {}", key,
                               errorMessage(e).cStr());
                  }));
  }
  return kj::joinPromises(reads.releaseAsArray())
      .then([this, servers = kj::mv(servers), texts = kj::mv(texts)]() {
        history_.beginRound((loop.calendarNow() - kj::UNIX_EPOCH) / kj::MILLISECONDS);
        for (auto& [url, readers] : servers) {
          auto it = texts->find(url);
          if (it == texts->end()) continue;
          for (auto& r : readers) {
            history_.add(r.name, r.jobId,
                         callTotals(it->second, kj::StringPtr(r.jobId.c_str()),
                                    kj::StringPtr(r.actor.c_str())));
          }
        }
        history_.endRound();
      })
      .then([next = kj::mv(next)]() mutable { return kj::mv(next); })
      .then([this]() { return round(); });
}

}  // namespace troupe::resolver_detail
