#include "troupe/resolver/detail/etcd_client.h"

#include <string.h>

#include "troupe/net/address.h"
#include "troupe/net/credentials.h"
#include "troupe/resolver/detail/etcd_session.h"
#include "troupe/resolver/detail/etcd_watch.h"

namespace troupe::resolver_detail {

namespace {

void checkRoot(kj::StringPtr root) {
  auto bad = [&](kj::StringPtr why) {
    throwError(ErrorCode::INVALID_ARGUMENT, kj::str("etcd root '", printable(root), "' ", why));
  };
  if (root.size() == 0) bad("is empty");
  if (root.size() > 256) bad("is longer than 256 bytes");
  for (char c : root) {
    if (c <= ' ' || c > '~') bad("must be printable ASCII without spaces");
  }
  if (root.startsWith("/") || root.endsWith("/")) bad("must not start or end with '/'");
}

// Reads newline-separated JSON objects from a response body, as etcd's gateway streams them.
class LineStream final : public EtcdStream {
public:
  LineStream(kj::Own<kj::AsyncInputStream> body, uint64_t limit)
      : body(kj::mv(body)), limit(limit) {}

  kj::Promise<kj::Maybe<kj::String>> next() override {
    for (;;) {
      // Only what came since the last look can hold the next newline: a large object arriving in
      // many reads is scanned once, not once per read.
      auto newline = buffer.find('\n', scanned);
      if (newline == std::string::npos) {
        scanned = buffer.size();
        break;
      }
      auto line = buffer.substr(0, newline);
      buffer.erase(0, newline + 1);
      scanned = 0;
      if (line.find_first_not_of(" \r\t") == std::string::npos) continue;
      return kj::Maybe<kj::String>(kj::heapString(line.data(), line.size()));
    }
    if (buffer.size() > limit) {
      return KJ_EXCEPTION(FAILED, "an object on etcd's watch stream is over the size limit");
    }
    return body->tryRead(chunk, 1, sizeof(chunk))
        .then([this](size_t n) -> kj::Promise<kj::Maybe<kj::String>> {
          if (n == 0) {
            if (buffer.find_first_not_of(" \r\t\n") == std::string::npos) {
              return kj::Maybe<kj::String>(nullptr);
            }
            auto rest = kj::heapString(buffer.data(), buffer.size());
            buffer.clear();
            scanned = 0;
            return kj::Maybe<kj::String>(kj::mv(rest));
          }
          buffer.append(chunk, n);
          return next();
        });
  }

private:
  kj::Own<kj::AsyncInputStream> body;
  uint64_t limit;
  std::string buffer;
  size_t scanned = 0;  // bytes of `buffer` known to hold no newline
  char chunk[16384];
};

// A tls:// member's address: each connection kj-http opens through it is wrapped in TLS, with
// the resolver's credentials (their CA, and their certificate for etcd's --client-cert-auth).
class TlsMemberAddress final : public kj::NetworkAddress {
public:
  TlsMemberAddress(kj::Own<kj::NetworkAddress> inner, std::shared_ptr<Credentials> credentials,
                   kj::Timer& timer, Address address)
      : inner(kj::mv(inner)),
        credentials(kj::mv(credentials)),
        timer(timer),
        address(kj::mv(address)) {}

  kj::Promise<kj::Own<kj::AsyncIoStream>> connect() override {
    return inner->connect().then([this](kj::Own<kj::AsyncIoStream> stream) {
      return credentials->wrapClient(timer, kj::mv(stream), address);
    });
  }
  kj::Own<kj::ConnectionReceiver> listen() override {
    KJ_UNIMPLEMENTED("an etcd member's address is only connected to");
  }
  kj::Own<kj::NetworkAddress> clone() override {
    return kj::heap<TlsMemberAddress>(inner->clone(), credentials, timer, address);
  }
  kj::String toString() override { return kj::str(address.toString()); }

private:
  kj::Own<kj::NetworkAddress> inner;
  std::shared_ptr<Credentials> credentials;
  kj::Timer& timer;
  Address address;
};

// What a failure to reach `address` may mean, when its message fits: a TLS member that turned
// the client's certificate (or its lack of one) away after the handshake, or a TLS member that
// hung up on a plain request. Which words the failure has depends on when the member closed
// (an alert read, a write cut off, a reset), so the hint is offered for each of them.
kj::StringPtr hintFor(const Address& address, const kj::Exception& e) {
  auto says = [&](const char* part) { return strstr(e.getDescription().cStr(), part) != nullptr; };
  bool closed = says("disconnected prematurely") || says("reset by peer") ||
                says("connection ended") || says("bad certificate") || says("certificate required");
  if (address.kind == Address::Kind::TLS && closed && !says("TLS handshake with")) {
    return "; if etcd requires client certificates (--client-cert-auth), set TROUPE_TLS_CERT and "
           "TROUPE_TLS_KEY to one signed by the CA of its --trusted-ca-file";
  }
  if (address.kind == Address::Kind::TCP && closed) {
    return "; if the member serves TLS, use tls:// members (etcds:// URLs)";
  }
  return "";
}

}  // namespace

// An HTTP client of one member, shared by the requests in flight on it: a response's body
// refers to its client, so the client stays until the last body goes, even after the member
// was given up on.
struct HttpConnection final : public kj::Refcounted {
  kj::Own<kj::NetworkAddress> address;
  kj::Own<kj::HttpClient> http;
};

struct EtcdClient::Member {
  Address address;
  kj::String text;  // for logs
  kj::Maybe<kj::Own<HttpConnection>> connection;
};

ErrorCode errorCodeOfGrpc(int code) {
  switch (code) {
    case 3:
      return ErrorCode::INVALID_ARGUMENT;
    case 4:
      return ErrorCode::DEADLINE_EXCEEDED;
    case 7:
      return ErrorCode::PERMISSION_DENIED;
    case 8:
      return ErrorCode::OVERLOADED;
    case 14:
      return ErrorCode::UNREACHABLE;
    case 16:
      return ErrorCode::UNAUTHENTICATED;
    default:
      return ErrorCode::FAILED;
  }
}

std::string prefixRangeEnd(const std::string& prefix) {
  std::string end = prefix;
  while (!end.empty()) {
    auto last = static_cast<unsigned char>(end.back());
    if (last < 0xff) {
      end.back() = static_cast<char>(last + 1);
      return end;
    }
    end.pop_back();
  }
  return std::string(1, '\0');  // every key
}

EtcdClient::EtcdClient(EventLoop& loop, EtcdResolverOptions optionsIn)
    : loop(loop),
      options(kj::mv(optionsIn)),
      log(options.logger ? options.logger : loop.logger()),
      credentials(options.credentials ? options.credentials : loopCredentials(loop)),
      retry(options.backoffInitial, options.backoffMax,
            "EtcdResolverOptions' backoffInitial and backoffMax"),
      tasks(*this) {
  if (options.maxRequestsInFlight == 0) {
    throwError(ErrorCode::INVALID_ARGUMENT,
               "EtcdResolverOptions::maxRequestsInFlight must be positive");
  }
  if (options.members.empty()) {
    throwError(ErrorCode::INVALID_ARGUMENT, "an etcd resolver needs at least one member");
  }
  checkRoot(options.root);
  rootPrefix = options.root + "/";
  endpointsPrefix = rootPrefix + "endpoints/";
  jobsPrefix = rootPrefix + "jobs/";
  kj::Vector<kj::Own<Member>> list;
  for (auto& text : options.members) {
    auto address = Address::parse(text.c_str());
    list.add(kj::heap<Member>(Member{address, kj::str(text), nullptr}));
  }
  members = list.releaseAsArray();
  codec.setMaxNestingDepth(16);
  codec.handleByAnnotation<schema::etcd::RangeRequest>();
  codec.handleByAnnotation<schema::etcd::RangeResponse>();
  codec.handleByAnnotation<schema::etcd::PutRequest>();
  codec.handleByAnnotation<schema::etcd::TxnRequest>();
  codec.handleByAnnotation<schema::etcd::TxnResponse>();
  codec.handleByAnnotation<schema::etcd::LeaseGrantRequest>();
  codec.handleByAnnotation<schema::etcd::LeaseGrantResponse>();
  codec.handleByAnnotation<schema::etcd::LeaseKeepAliveRequest>();
  codec.handleByAnnotation<schema::etcd::LeaseKeepAliveResult>();
  codec.handleByAnnotation<schema::etcd::LeaseRevokeRequest>();
  codec.handleByAnnotation<schema::etcd::WatchRequest>();
  codec.handleByAnnotation<schema::etcd::WatchResult>();
  codec.handleByAnnotation<schema::etcd::Status>();
  codec.handleByAnnotation<schema::etcd::Job>();
}

EtcdClient::~EtcdClient() noexcept(false) {}

void EtcdClient::taskFailed(kj::Exception&& exception) {
  log->debug("etcd: a background request failed: {}", exception.getDescription().cStr());
}

EtcdWatchHub& EtcdClient::hub() {
  if (watchHub.get() == nullptr) watchHub = kj::heap<EtcdWatchHub>(*this);
  return *watchHub;
}

EtcdSession& EtcdClient::session() {
  if (leaseSession.get() == nullptr) leaseSession = kj::heap<EtcdSession>(*this);
  return *leaseSession;
}

EtcdClient::Member& EtcdClient::member(size_t index) { return *members[index]; }

kj::Promise<kj::HttpClient::Response> EtcdClient::send(size_t index, kj::StringPtr path,
                                                       kj::StringPtr body) {
  auto& m = member(index);
  kj::Promise<void> ready = kj::READY_NOW;
  if (m.connection == nullptr) {
    ready = loop.network()
                .parseAddress(m.address.toKjAddress())
                .then([this, &m](kj::Own<kj::NetworkAddress> resolved) {
                  if (m.address.kind == Address::Kind::TLS) {
                    resolved = kj::heap<TlsMemberAddress>(kj::mv(resolved), credentials,
                                                          loop.timer(), m.address);
                  }
                  // Keeps idle connections for reuse (kj-http's default, 5 s).
                  auto connection = kj::refcounted<HttpConnection>();
                  connection->http = kj::newHttpClient(loop.timer(), headerTable, *resolved);
                  connection->address = kj::mv(resolved);
                  m.connection = kj::mv(connection);
                });
  }
  return ready.then([this, &m, path, body]() {
    auto& connection = *KJ_ASSERT_NONNULL(m.connection);
    kj::HttpHeaders headers(headerTable);
    headers.set(kj::HttpHeaderId::HOST, "etcd");
    headers.set(kj::HttpHeaderId::CONTENT_TYPE, "application/json");
    auto request = connection.http->request(kj::HttpMethod::POST, path, headers,
                                            uint64_t{body.size()});
    auto written = request.body->write(body.begin(), body.size()).attach(kj::mv(request.body));
    return written
        .then([response = kj::mv(request.response)]() mutable { return kj::mv(response); })
        .then([held = kj::addRef(connection)](kj::HttpClient::Response&& response) mutable {
          response.body = response.body.attach(kj::mv(held));
          return kj::mv(response);
        });
  });
}

kj::Promise<void> EtcdClient::turn(bool& granted, bool woken) {
  if (inFlight < options.maxRequestsInFlight) {
    ++inFlight;
    granted = true;
    return kj::READY_NOW;
  }
  auto paf = kj::newPromiseAndFulfiller<void>();
  // One woken whose place was taken by a newcomer keeps its place in the line.
  if (woken) {
    waiting.push_front(kj::mv(paf.fulfiller));
  } else {
    waiting.push_back(kj::mv(paf.fulfiller));
  }
  return paf.promise.then([this, &granted]() { return turn(granted, true); });
}

void EtcdClient::finished() {
  --inFlight;
  // Wakes the first waiter still there; it takes the free place when its turn comes (one that
  // was cancelled meanwhile takes nothing).
  while (!waiting.empty()) {
    auto next = kj::mv(waiting.front());
    waiting.pop_front();
    if (next->isWaiting()) {
      next->fulfill();
      return;
    }
  }
}

kj::Promise<kj::String> EtcdClient::postJson(kj::StringPtr path, kj::String body) {
  // Whether this request holds a place; it gives it back when it goes, answered or cancelled.
  auto granted = kj::heap<bool>(false);
  auto& holds = *granted;
  return turn(holds)
      .then([this, path, body = kj::mv(body)]() mutable {
        return tryFrom(current, 0, path, kj::mv(body));
      })
      .attach(kj::defer([this, granted = kj::mv(granted)]() {
        if (*granted) finished();
      }));
}

kj::Promise<kj::String> EtcdClient::tryFrom(size_t index, size_t tried, kj::StringPtr path,
                                            kj::String body) {
  auto& m = member(index);
  auto attempt = send(index, path, body).then([this, path](kj::HttpClient::Response&& response) {
    auto status = response.statusCode;
    return response.body->readAllText(options.maxResponseBytes)
        .attach(kj::mv(response.body))
        .then(
            [status](kj::String text) -> kj::Promise<std::pair<uint, kj::String>> {
              return std::make_pair(status, kj::mv(text));
            },
            [this, path](kj::Exception&& e) -> kj::Promise<std::pair<uint, kj::String>> {
              if (e.getType() == kj::Exception::Type::DISCONNECTED) return kj::mv(e);
              return makeError(ErrorCode::MESSAGE_TOO_LARGE,
                               kj::str("etcd's answer to ", path, " is over the limit of ",
                                       options.maxResponseBytes,
                                       " bytes (EtcdResolverOptions::maxResponseBytes)"));
            });
  });
  auto timed = loop.timer().timeoutAfter(options.requestTimeout, kj::mv(attempt));
  return timed.then(
      [this, index, path](std::pair<uint, kj::String>&& reply) -> kj::Promise<kj::String> {
        current = index;
        if (reply.first == 200) return kj::mv(reply.second);
        auto status = decode<schema::etcd::Status>(reply.second);
        auto s = status.get();
        auto message = s.getMessage().size() > 0 ? s.getMessage() : s.getError();
        return makeError(errorCodeOfGrpc(s.getCode()),
                         kj::str("etcd refused ", path, " (HTTP ", reply.first, "): ",
                                 message.size() > 0 ? message : kj::StringPtr("no message")));
      },
      [this, index, tried, path, &m,
       body = kj::mv(body)](kj::Exception&& e) mutable -> kj::Promise<kj::String> {
        if (errorCode(e) == ErrorCode::MESSAGE_TOO_LARGE) return kj::mv(e);
        // The connection failed or timed out: this member is no good for now.
        m.connection = nullptr;
        if (tried + 1 < members.size()) {
          log->debug("etcd member {} failed ({}); trying the next", m.text.cStr(),
                     e.getDescription().cStr());
          return tryFrom((index + 1) % members.size(), tried + 1, path, kj::mv(body));
        }
        return makeError(ErrorCode::UNREACHABLE,
                         kj::str("no etcd member answered ", path, " (last, ", m.text, ": ",
                                 e.getDescription(), ")", hintFor(m.address, e)));
      });
}

kj::Promise<kj::Own<EtcdStream>> EtcdClient::stream(kj::StringPtr path, kj::String body) {
  size_t index = current;
  auto opened = send(index, path, body).attach(kj::mv(body));
  auto timed = loop.timer().timeoutAfter(options.requestTimeout, kj::mv(opened));
  return timed.then(
      [this, path, index](kj::HttpClient::Response&& response) -> kj::Promise<kj::Own<EtcdStream>> {
        if (response.statusCode != 200) {
          return response.body->readAllText(options.maxResponseBytes)
              .attach(kj::mv(response.body))
              .then([path](kj::String text) -> kj::Own<EtcdStream> {
                throwError(ErrorCode::FAILED,
                           kj::str("etcd refused ", path, ": ", printable(text)));
              });
        }
        auto opened = kj::heap<LineStream>(kj::mv(response.body), options.maxResponseBytes);
        opened->member = index;
        return kj::Own<EtcdStream>(kj::mv(opened));
      },
      [this, index](kj::Exception&& e) -> kj::Promise<kj::Own<EtcdStream>> {
        auto& m = member(index);
        m.connection = nullptr;
        current = (index + 1) % members.size();  // the next attempt goes elsewhere
        return makeError(ErrorCode::UNREACHABLE,
                         kj::str("etcd member ", m.text,
                                 " did not open a watch: ", e.getDescription()));
      });
}

}  // namespace troupe::resolver_detail
