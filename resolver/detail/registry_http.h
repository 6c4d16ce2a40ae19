#pragma once
// What a RegistryServer serves over HTTP besides /metrics: the dashboard's page and its API.
//
//   GET /                       the dashboard (HTML), /dashboard.js, /dashboard.css
//   GET /healthz                200 "ok" while the registry serves
//   GET /api/state              {"jobs": [JobInfo...], "endpoints": [Endpoint...]} (JSON, as
//                               capnp-json writes schemas/registry.capnp's structs)
//   GET /api/events             server-sent events, one `data:` line per WatchEvent as JSON
//                               ({"added": Endpoint}, {"changed": ...}, {"removed": ...},
//                               {"synced": null}, {"jobEnded": JobStatus}), fed by a watch of
//                               every endpoint: first the snapshot, then every change; a comment
//                               line every 15 s keeps it open
//   GET /api/metrics?endpoint=N the /metrics text of endpoint N, fetched by the registry from the
//                               URL the endpoint published under "metrics" (only when that URL's
//                               host is the endpoint address's host), so a browser needs to
//                               reach only the registry
//   GET /api/history            every job's totals over time: schemas/dashboard.capnp's History
//   GET /api/history?job=J      job J's totals and each of its endpoints' series
//   GET /api/job?job=J          job J's page: schemas/dashboard.capnp's JobPage (its replicas
//                               and resources from its launcher, its events, its logs' last lines)

#include <memory>

#include <kj/compat/http.h>

#include "troupe/net/credentials.h"
#include "troupe/observe/http_endpoint.h"
#include "troupe/resolver/detail/metrics_reader.h"
#include "troupe/resolver/detail/registry_table.h"

namespace troupe::resolver_detail {

class EventSession;

// Belongs to the registry's loop. The HttpEndpoint it serves behind must be set (attach())
// before the first request and outlive it.
class RegistryHttp final : public kj::HttpService {
public:
  RegistryHttp(EventLoop& loop, kj::Own<RegistryTable> table,
               std::shared_ptr<Credentials> credentials, HistoryOptions history,
               std::shared_ptr<spdlog::logger> log);
  ~RegistryHttp() noexcept(false);
  KJ_DISALLOW_COPY(RegistryHttp);

  void attach(HttpEndpoint& endpoint) { this->endpoint = endpoint; }

  // Paths any browser may fetch without the cluster token: the page itself and its assets,
  // which hold no data.
  static std::vector<std::string> publicPaths();

  kj::Promise<void> request(kj::HttpMethod method, kj::StringPtr url,
                            const kj::HttpHeaders& headers, kj::AsyncInputStream& body,
                            Response& response) override;

  // Event streams open now.
  size_t streamCount() const { return streams; }

private:
  friend class EventSession;

  kj::Promise<void> state(Response& response);
  kj::Promise<void> events(Response& response);
  kj::Promise<void> endpointMetrics(kj::StringPtr url, Response& response);
  kj::Promise<void> history(kj::StringPtr url, Response& response);
  kj::Promise<void> jobPage(kj::StringPtr url, Response& response);
  const kj::HttpHeaderTable& table() const;

  EventLoop& loop;
  kj::Own<RegistryTable> registry;
  std::shared_ptr<Credentials> credentials;
  std::shared_ptr<spdlog::logger> log;
  kj::Maybe<HttpEndpoint&> endpoint;
  MetricsReader reader;
  size_t streams = 0;
};

}  // namespace troupe::resolver_detail
