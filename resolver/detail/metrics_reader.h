#pragma once
// MetricsReader: how the registry reads its endpoints' /metrics, on a browser's behalf
// (GET /api/metrics) and every HistoryOptions::interval into a MetricsHistory (the dashboard's
// charts). It fetches only from the URL an endpoint published under "metrics", and only when
// that URL's host is the host of the endpoint's address, so a registrant cannot point the
// registry elsewhere. Each server is read once per round, however many actors it hosts.

#include <memory>
#include <string>

#include <kj/async.h>
#include <kj/compat/http.h>

#include "troupe/base/event_loop.h"
#include "troupe/net/credentials.h"
#include "troupe/resolver/detail/metrics_history.h"
#include "troupe/resolver/detail/registry_table.h"

namespace troupe::resolver_detail {

// Where the registry may read `endpoint`'s metrics ("http://host:port"). Throws UNIMPLEMENTED when
// it serves none, and INVALID_ARGUMENT when it publishes them off its own host.
std::string metricsUrlOf(const Endpoint& endpoint);

// Belongs to the registry's loop.
class MetricsReader {
public:
  MetricsReader(EventLoop& loop, RegistryTable& table, std::shared_ptr<Credentials> credentials,
                HistoryOptions options, std::shared_ptr<spdlog::logger> log);
  ~MetricsReader() noexcept(false);
  KJ_DISALLOW_COPY(MetricsReader);

  // The /metrics text at `url` ("http://host:port"): rejects with OVERLOADED when it takes
  // longer than `timeout`, and FAILED for an HTTP status other than 200.
  kj::Promise<kj::String> fetch(kj::StringPtr url, kj::Duration timeout);

  const MetricsHistory& history() const { return history_; }

private:
  // Reads every endpoint once, records the round, and starts the next after the interval.
  kj::Promise<void> round();

  EventLoop& loop;
  RegistryTable& table;
  std::shared_ptr<Credentials> credentials;
  std::shared_ptr<spdlog::logger> log;
  kj::Own<kj::HttpHeaderTable> headers;
  kj::Own<kj::Network> tlsNetwork;  // for endpoints that serve HTTPS
  kj::Own<kj::HttpClient> client;
  MetricsHistory history_;
  kj::Promise<void> rounds = nullptr;  // last: it uses everything above
};

}  // namespace troupe::resolver_detail
