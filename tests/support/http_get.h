#pragma once
// A plain HTTP GET for tests of HTTP endpoints, on the test's own loop (kj-http's client).

#include <string>
#include <utility>
#include <vector>

#include <kj/compat/http.h>

#include "troupe/base/event_loop.h"
#include "tests/support/registry_helpers.h"

namespace troupe::test {

struct HttpResult {
  uint status = 0;
  std::string contentType;
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;  // every response header
  bool contains(const char* part) const { return body.find(part) != std::string::npos; }
};

// GETs `url` ("http://127.0.0.1:PORT/path"), with `bearer` as an Authorization: Bearer token
// when not empty, and `method` other than GET when asked. Fails the test after PATIENCE.
inline HttpResult httpGet(EventLoop& loop, const std::string& url, const std::string& bearer = "",
                          kj::HttpMethod method = kj::HttpMethod::GET) {
  kj::HttpHeaderTable table;
  auto client = kj::newHttpClient(loop.timer(), table, loop.network(), nullptr);
  kj::HttpHeaders headers(table);
  if (!bearer.empty()) headers.add("Authorization", kj::str("Bearer ", bearer.c_str()));
  auto request = client->request(method, url.c_str(), headers, uint64_t{0});
  auto done = request.response.then([](kj::HttpClient::Response&& response) {
    auto result = kj::heap<HttpResult>();
    result->status = response.statusCode;
    KJ_IF_MAYBE(type, response.headers->get(kj::HttpHeaderId::CONTENT_TYPE)) {
      result->contentType = type->cStr();
    }
    response.headers->forEach([&](kj::StringPtr name, kj::StringPtr value) {
      result->headers.emplace_back(name.cStr(), value.cStr());
    });
    auto read = response.body->readAllText();
    return read.attach(kj::mv(response.body))
        .then([result = kj::mv(result)](kj::String text) mutable {
          result->body = text.cStr();
          return kj::mv(*result);
        });
  });
  return await(loop, kj::mv(done));
}

}  // namespace troupe::test
