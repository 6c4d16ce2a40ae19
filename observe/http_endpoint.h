#pragma once
// HttpEndpoint: a process's HTTP face for people and monitoring (kj-http): /metrics in the
// Prometheus text format from its loop's metrics, and whatever its owner adds (an ActorServer's
// /healthz and /actors, the registry's dashboard).

#include <memory>
#include <set>
#include <string>
#include <vector>

#include <kj/async-io.h>
#include <kj/compat/http.h>

#include "troupe/base/event_loop.h"
#include "troupe/net/credentials.h"

namespace spdlog {
class logger;
}

namespace troupe {

struct HttpEndpointOptions {
  // What the endpoint checks requests against, and serves TLS with. When they hold a cluster
  // token, every request except those for `publicPaths` must carry it as
  // "Authorization: Bearer <token>" (Prometheus: `authorization: {credentials_file: ...}`);
  // others get 401. When they can serve TLS the endpoint speaks HTTPS only. Default: null, the
  // loop's credentials.
  std::shared_ptr<Credentials> credentials;

  // Paths served without the token: what a load balancer's or Kubernetes' probe asks for, and
  // nothing that names actors or jobs. Default: "/healthz".
  std::vector<std::string> publicPaths = {"/healthz"};

  // Connections open at once; one past it is closed as soon as it is accepted. Default 256.
  uint32_t maxConnections = 256;

  // How long a request's headers may take to arrive, and how long a connection may sit idle
  // between requests, before it is closed. Defaults 10 s and 30 s.
  kj::Duration headerTimeout = 10 * kj::SECONDS;
  kj::Duration idleTimeout = 30 * kj::SECONDS;

  // Where failed connections are logged. Default: the loop's logger.
  std::shared_ptr<spdlog::logger> logger;
};

// Listens on one address and serves HTTP/1.1 GET requests: /metrics itself, any other path
// through `routes` (404 without them). Belongs to `loop`; dropping it closes the listener and
// every connection at once.
class HttpEndpoint final : private kj::TaskSet::ErrorHandler, private kj::HttpService {
public:
  // `address`: "HOST:PORT" or "http://HOST:PORT" (port 0 for any free port; "https://" asks
  // for TLS, which the credentials must be able to serve). `routes` (borrowed, must outlive the
  // endpoint) answers every path but /metrics, after the endpoint checked the token; it builds
  // its headers from headerTable(). Throws INVALID_ARGUMENT for a malformed address and
  // ADDRESS_IN_USE when it is taken.
  HttpEndpoint(EventLoop& loop, kj::StringPtr address, HttpEndpointOptions options = {},
               kj::Maybe<kj::HttpService&> routes = nullptr);
  ~HttpEndpoint() noexcept(false);
  KJ_DISALLOW_COPY(HttpEndpoint);

  // Throws INVALID_ARGUMENT, as the constructor would, when `address` is malformed; binds nothing.
  static void checkAddress(kj::StringPtr address);

  // "http://HOST:PORT" (or https) with the port bound and HOST as given.
  const std::string& url() const { return url_; }
  uint16_t port() const { return port_; }

  // The header table requests are parsed with and responses should be built from.
  const kj::HttpHeaderTable& headerTable() const { return *headers; }

  // Requests answered so far (any status), for tests and metrics.
  uint64_t requestCount() const { return requests; }

private:
  kj::Promise<void> request(kj::HttpMethod method, kj::StringPtr url,
                            const kj::HttpHeaders& headers, kj::AsyncInputStream& body,
                            Response& response) override;
  void taskFailed(kj::Exception&& exception) override;
  kj::Promise<void> acceptLoop();
  bool authorized(kj::StringPtr path, const kj::HttpHeaders& headers) const;

  EventLoop& loop;
  HttpEndpointOptions options;
  std::shared_ptr<spdlog::logger> log;
  kj::Maybe<kj::HttpService&> routes;
  kj::Own<kj::HttpHeaderTable> headers;
  kj::HttpHeaderId authorization;
  kj::HttpHeaderId wwwAuthenticate;
  bool tls = false;
  std::string url_;
  uint16_t port_ = 0;
  uint64_t requests = 0;
  uint32_t open = 0;
  kj::Own<kj::ConnectionReceiver> receiver;
  kj::Own<kj::HttpServer> server;
  kj::Own<kj::TaskSet> tasks;
  kj::Promise<void> accepting = nullptr;
};

// The host of "http://HOST:PORT" or "https://HOST:PORT" (an IPv6 literal without brackets), as
// servers publish their HTTP URL; null for anything else. For clients that must fetch only from
// the host an endpoint's own address names.
kj::Maybe<std::string> httpUrlHost(kj::StringPtr url);

// Writes `body` as the whole response with `status` and `contentType` (and "Cache-Control:
// no-store"), for routes. The promise owns `body` until it is written.
kj::Promise<void> sendHttpText(kj::HttpService::Response& response,
                               const kj::HttpHeaderTable& table, uint status,
                               kj::StringPtr contentType, kj::String body);

}  // namespace troupe
