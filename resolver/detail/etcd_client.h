#pragma once
// EtcdClient: what an EtcdResolver and everything it hands out share: HTTP/1.1 clients of the
// etcd members' JSON gateways (one pool of connections per member, failing over in order), the
// JSON codec for etcd's messages, the key layout under the root, and the backoff.

#include <deque>
#include <memory>
#include <string>

#include <capnp/compat/json.h>
#include <capnp/message.h>
#include <kj/async.h>
#include <kj/compat/http.h>
#include <kj/refcount.h>
#include <spdlog/spdlog.h>

#include "troupe/base/backoff.h"
#include "troupe/base/errors.h"
#include "troupe/net/credentials.h"
#include "troupe/resolver/etcd_resolver.h"
#include "troupe/schemas/etcd_gateway.capnp.h"

namespace troupe::resolver_detail {

class EtcdSession;
class EtcdWatchHub;

// A decoded JSON reply: the message that holds it and its root.
template <typename T>
struct EtcdReply {
  kj::Own<capnp::MallocMessageBuilder> message;
  typename T::Reader get() { return message->getRoot<T>().asReader(); }
};

// The objects of a streaming reply (a watch), one at a time.
class EtcdStream {
public:
  virtual ~EtcdStream() noexcept(false) = default;
  // The next JSON object of the stream; null once it ended. Rejects with DISCONNECTED when the
  // connection breaks and FAILED for an object over the size limit.
  virtual kj::Promise<kj::Maybe<kj::String>> next() = 0;

  size_t member = 0;  // the index of the member it came from
};

// Shared (kj::addRef) by the resolver, its registrations and its watches. Loop thread only.
class EtcdClient final : public kj::Refcounted, private kj::TaskSet::ErrorHandler {
public:
  // Validates options (members, root); throws INVALID_ARGUMENT.
  EtcdClient(EventLoop& loop, EtcdResolverOptions options);
  ~EtcdClient() noexcept(false);
  KJ_DISALLOW_COPY(EtcdClient);

  EventLoop& loop;
  const EtcdResolverOptions options;
  std::shared_ptr<spdlog::logger> log;
  std::shared_ptr<Credentials> credentials;  // options' or the loop's

  // POSTs `request` (a capnp struct, as JSON) to `path` ("/v3/kv/range") and decodes the reply
  // as a `Reply`. Goes to the member that answered last; a member that cannot be reached (or
  // does not answer within the request timeout) is left for the next. Rejects with UNREACHABLE
  // when none answers, and with the gateway's error mapped to troupe's codes (its message kept)
  // when etcd refuses the request.
  template <typename Reply, typename Request>
  kj::Promise<EtcdReply<Reply>> post(kj::StringPtr path, Request request) {
    return postJson(path, codec.encode(request)).then([this](kj::String body) {
      return decode<Reply>(body);
    });
  }
  kj::Promise<kj::String> postJson(kj::StringPtr path, kj::String body);

  // Requests sent and not yet answered (at most options.maxRequestsInFlight).
  size_t requestsInFlight() const { return inFlight; }

  // Opens a streaming request (a watch) with no deadline once the reply's headers came.
  kj::Promise<kj::Own<EtcdStream>> stream(kj::StringPtr path, kj::String body);

  template <typename T>
  EtcdReply<T> decode(kj::ArrayPtr<const char> json) {
    auto message = kj::heap<capnp::MallocMessageBuilder>();
    auto root = message->initRoot<T>();
    KJ_IF_MAYBE(e, kj::runCatchingExceptions([&]() { codec.decode(json, root); })) {
      throwError(ErrorCode::FAILED,
                 kj::str("etcd answered with JSON troupe cannot read: ", errorMessage(*e)));
    }
    return EtcdReply<T>{kj::mv(message)};
  }

  template <typename T>
  kj::String encode(T reader) {
    return codec.encode(reader);
  }

  // Keys.
  std::string endpointKey(kj::StringPtr name) const { return endpointsPrefix + name.cStr(); }
  std::string jobKey(kj::StringPtr jobId) const { return jobsPrefix + jobId.cStr(); }
  std::string endpointsPrefix;  // "<root>/endpoints/"
  std::string jobsPrefix;       // "<root>/jobs/"
  std::string rootPrefix;       // "<root>/"

  // The watch hub this client's watches share; made on first use.
  EtcdWatchHub& hub();

  // The lease this client's registrations share; made on first use.
  EtcdSession& session();

  // The member requests go to now (the one that answered last).
  size_t currentMember() const { return current; }

  kj::Duration backoff(uint32_t attempt) { return retry.delay(attempt, loop.random()); }

  // Runs `promise` in the background (a revoke after a registration went), logging a failure.
  void detach(kj::Promise<void> promise) { tasks.add(kj::mv(promise)); }

private:
  struct Member;

  void taskFailed(kj::Exception&& exception) override;
  kj::Promise<kj::HttpClient::Response> send(size_t member, kj::StringPtr path, kj::StringPtr body);
  kj::Promise<kj::String> tryFrom(size_t member, size_t tried, kj::StringPtr path, kj::String body);
  Member& member(size_t index);
  // Resolves once this request may be sent (fewer than maxRequestsInFlight were in flight),
  // setting `granted` as it takes its place.
  kj::Promise<void> turn(bool& granted, bool woken = false);
  void finished();

  capnp::JsonCodec codec;
  kj::HttpHeaderTable headerTable;
  kj::Array<kj::Own<Member>> members;
  size_t current = 0;  // the member that answered last
  size_t inFlight = 0;
  std::deque<kj::Own<kj::PromiseFulfiller<void>>> waiting;  // requests waiting for their turn
  Backoff retry;
  kj::Own<EtcdWatchHub> watchHub;
  kj::Own<EtcdSession> leaseSession;
  kj::TaskSet tasks;
};

// The troupe error code for a gRPC status code from etcd's gateway.
ErrorCode errorCodeOfGrpc(int code);

// `prefix` with its last byte incremented: the end of etcd's range of keys starting with it.
std::string prefixRangeEnd(const std::string& prefix);

// Bytes of a std::string, for capnp Data fields.
inline capnp::Data::Reader bytesOf(const std::string& s) {
  return capnp::Data::Reader(reinterpret_cast<const kj::byte*>(s.data()), s.size());
}
inline std::string stringOf(capnp::Data::Reader d) {
  return std::string(reinterpret_cast<const char*>(d.begin()), d.size());
}

}  // namespace troupe::resolver_detail
