#include "troupe/observe/http_endpoint.h"

#include <algorithm>

#include <kj/debug.h>
#include <spdlog/spdlog.h>

#include "troupe/base/errors.h"
#include "troupe/net/address.h"
#include "troupe/net/listen_socket.h"

namespace troupe {

namespace {

constexpr kj::StringPtr PROMETHEUS_TEXT = "text/plain; version=0.0.4; charset=utf-8"_kj;

// "HOST:PORT", "http://HOST:PORT" or "https://HOST:PORT" as a TCP address, and whether TLS was
// asked for.
Address parseHttpAddress(kj::StringPtr text, bool& https) {
  kj::StringPtr rest = text;
  https = false;
  if (text.startsWith("https://")) {
    https = true;
    rest = text.slice(8);
  } else if (text.startsWith("http://")) {
    rest = text.slice(7);
  }
  if (rest.endsWith("/")) {
    throwError(ErrorCode::INVALID_ARGUMENT,
               kj::str("an HTTP listen address is HOST:PORT, without a path: '", printable(text),
                       "'"));
  }
  Address a;
  KJ_IF_MAYBE(e, kj::runCatchingExceptions([&]() { a = Address::parse(rest); })) {
    throwError(ErrorCode::INVALID_ARGUMENT,
               kj::str("bad HTTP listen address '", printable(text),
                       "': expected HOST:PORT or http://HOST:PORT (", errorMessage(*e), ")"));
  }
  if (a.kind != Address::Kind::TCP) {
    throwError(ErrorCode::INVALID_ARGUMENT, kj::str("bad HTTP listen address '", printable(text),
                                                    "': expected HOST:PORT or http://HOST:PORT"));
  }
  return a;
}

// The path of a request target, without its query.
kj::StringPtr pathOf(kj::StringPtr url, kj::String& storage) {
  KJ_IF_MAYBE(q, url.findFirst('?')) {
    storage = kj::heapString(url.slice(0, *q));
    return storage;
  }
  return url;
}

}  // namespace

kj::Maybe<std::string> httpUrlHost(kj::StringPtr url) {
  kj::StringPtr rest;
  if (url.startsWith("http://")) {
    rest = url.slice(7);
  } else if (url.startsWith("https://")) {
    rest = url.slice(8);
  } else {
    return nullptr;
  }
  Address parsed;
  if (kj::runCatchingExceptions([&]() { parsed = Address::parse(rest); }) != nullptr ||
      parsed.kind != Address::Kind::TCP) {
    return nullptr;
  }
  return parsed.host;
}

kj::Promise<void> sendHttpText(kj::HttpService::Response& response,
                               const kj::HttpHeaderTable& table, uint status,
                               kj::StringPtr contentType, kj::String body) {
  kj::HttpHeaders headers(table);
  headers.set(kj::HttpHeaderId::CONTENT_TYPE, contentType);
  headers.add("Cache-Control", "no-store");
  headers.add("X-Content-Type-Options", "nosniff");
  kj::StringPtr text = status == 200   ? "OK"_kj
                       : status == 401 ? "Unauthorized"_kj
                       : status == 404 ? "Not Found"_kj
                       : status == 405 ? "Method Not Allowed"_kj
                       : status == 502 ? "Bad Gateway"_kj
                       : status == 503 ? "Service Unavailable"_kj
                                       : "Error"_kj;
  auto stream = response.send(status, text, headers, body.size());
  auto write = stream->write(body.begin(), body.size());
  return write.attach(kj::mv(stream), kj::mv(body));
}

void HttpEndpoint::checkAddress(kj::StringPtr address) {
  bool https = false;
  parseHttpAddress(address, https);
}

HttpEndpoint::HttpEndpoint(EventLoop& loop, kj::StringPtr address, HttpEndpointOptions options,
                           kj::Maybe<kj::HttpService&> routes)
    : loop(loop),
      options(kj::mv(options)),
      log(this->options.logger ? this->options.logger : loop.logger()),
      routes(routes),
      tasks(kj::heap<kj::TaskSet>(static_cast<kj::TaskSet::ErrorHandler&>(*this))) {
  if (!this->options.credentials) this->options.credentials = loopCredentials(loop);
  kj::HttpHeaderTable::Builder builder;
  authorization = builder.add("Authorization");
  wwwAuthenticate = builder.add("WWW-Authenticate");
  headers = builder.build();

  bool https = false;
  auto bound = parseHttpAddress(address, https);
  tls = this->options.credentials->canServeTls();
  if (https && !tls) {
    throwError(ErrorCode::INVALID_ARGUMENT, kj::str("cannot serve ", address,
                                                    ": no TLS certificate and key are configured "
                                                    "(TROUPE_TLS_CERT, TROUPE_TLS_KEY)"));
  }
  auto socket = openListenSocket(loop.lowLevelIo(), bound);
  receiver = kj::mv(socket.receiver);
  port_ = socket.bound.port;
  auto host = bound.host.find(':') != std::string::npos ? "[" + bound.host + "]" : bound.host;
  url_ = (tls ? "https://" : "http://") + host + ":" + std::to_string(port_);

  kj::HttpServerSettings settings;
  settings.headerTimeout = this->options.headerTimeout;
  settings.pipelineTimeout = this->options.idleTimeout;
  server = kj::heap<kj::HttpServer>(loop.timer(), *headers, static_cast<kj::HttpService&>(*this),
                                    settings);
  accepting = acceptLoop().eagerlyEvaluate([this](kj::Exception&& e) {
    log->error("HTTP endpoint {} stopped accepting: {}", url_, e.getDescription().cStr());
  });
}

HttpEndpoint::~HttpEndpoint() noexcept(false) {
  accepting = nullptr;
  tasks = nullptr;  // the connections, before the server they use
  server = nullptr;
}

kj::Promise<void> HttpEndpoint::acceptLoop() {
  return receiver->accept().then([this](kj::Own<kj::AsyncIoStream> stream) {
    if (open >= options.maxConnections) {
      log->warn("HTTP endpoint {}: closed a connection as it came: {} are open, the most "
                "HttpEndpointOptions::maxConnections allows",
                url_, open);
      return acceptLoop();
    }
    ++open;
    kj::Promise<kj::Own<kj::AsyncIoStream>> ready =
        tls ? options.credentials->wrapServer(loop.timer(), kj::mv(stream),
                                              loop.timer().now() + options.headerTimeout)
            : kj::Promise<kj::Own<kj::AsyncIoStream>>(kj::mv(stream));
    tasks->add(
        ready.then([this](kj::Own<kj::AsyncIoStream> s) { return server->listenHttp(kj::mv(s)); })
            .attach(kj::defer([this]() { --open; })));
    return acceptLoop();
  });
}

void HttpEndpoint::taskFailed(kj::Exception&& exception) {
  // A client that went away mid-request, or a failed TLS handshake.
  log->debug("HTTP endpoint {}: a connection failed: {}", url_, exception.getDescription().cStr());
}

bool HttpEndpoint::authorized(kj::StringPtr path, const kj::HttpHeaders& requestHeaders) const {
  auto& credentials = *options.credentials;
  if (!credentials.hasToken()) return true;
  auto& open = options.publicPaths;
  if (std::find(open.begin(), open.end(), path.cStr()) != open.end()) return true;
  KJ_IF_MAYBE(value, requestHeaders.get(authorization)) {
    if (value->startsWith("Bearer ")) {
      auto token = value->slice(7);
      return credentials.tokenMatches(token.asBytes());
    }
  }
  return false;
}

kj::Promise<void> HttpEndpoint::request(kj::HttpMethod method, kj::StringPtr url,
                                        const kj::HttpHeaders& requestHeaders,
                                        kj::AsyncInputStream& body, Response& response) {
  ++requests;
  kj::String storage;
  auto path = pathOf(url, storage);
  if (method != kj::HttpMethod::GET && method != kj::HttpMethod::HEAD) {
    return sendHttpText(response, *headers, 405, "text/plain; charset=utf-8",
                        kj::str("only GET is served here\n"));
  }
  if (!authorized(path, requestHeaders)) {
    kj::HttpHeaders h(*headers);
    h.set(wwwAuthenticate, "Bearer realm=\"troupe\"");
    h.set(kj::HttpHeaderId::CONTENT_TYPE, "text/plain; charset=utf-8");
    kj::StringPtr text = "this endpoint needs the cluster token: Authorization: Bearer <token>\n";
    auto stream = response.send(401, "Unauthorized", h, text.size());
    auto write = stream->write(text.begin(), text.size());
    return write.attach(kj::mv(stream));
  }
  if (path == "/metrics") {
    auto text = loop.metrics().collect().toPrometheusText();
    return sendHttpText(response, *headers, 200, PROMETHEUS_TEXT, kj::heapString(text));
  }
  KJ_IF_MAYBE(r, routes) {
    return r->request(method, url, requestHeaders, body, response);
  }
  return sendHttpText(response, *headers, 404, "text/plain; charset=utf-8", kj::str("not found\n"));
}

}  // namespace troupe
