#include "troupe/net/channel.h"

#include <kj/debug.h>
#include <spdlog/spdlog.h>

#include "troupe/base/errors.h"
#include "troupe/net/detail/rpc_connection.h"

namespace troupe {

class Channel::ErrorHandler final : public kj::TaskSet::ErrorHandler {
public:
  explicit ErrorHandler(Channel& channel) : channel(channel) {}
  void taskFailed(kj::Exception&& e) override {
    channel.loop_.logger()->debug("channel to {}: {}", channel.addressText,
                                  e.getDescription().cStr());
  }

private:
  Channel& channel;
};

kj::Own<Channel> Channel::open(EventLoop& loop, kj::StringPtr address, ChannelOptions options) {
  return kj::refcounted<Channel>(loop, Address::parse(address), options);
}

Channel::Channel(EventLoop& loop, Address address, ChannelOptions options)
    : loop_(loop),
      address_(kj::mv(address)),
      addressText(address_.toString()),
      options(options),
      credentials_(options.credentials ? options.credentials : loopCredentials(loop)),
      errorHandler(kj::heap<ErrorHandler>(*this)),
      tasks(kj::heap<kj::TaskSet>(*errorHandler)) {
  metricsRegistration = loop.metrics().add(*this);
}

void Channel::collectMetrics(MetricsSnapshot& out) const {
  MetricLabels labels = {{"peer", addressText}};
  auto counter = [&](kj::StringPtr name, kj::StringPtr help, uint64_t value) {
    out.add(name, help, MetricType::COUNTER, labels, static_cast<double>(value));
  };
  counter("troupe_client_connections_total", "Connections made to each server.", connectionsMade_);
  out.add("troupe_client_connected", "Connections open to each server now.", MetricType::GAUGE,
          labels, connection == nullptr ? 0 : 1);
  counter("troupe_client_messages_sent_total", "Messages sent to each server.",
          counters.messagesSent);
  counter("troupe_client_messages_received_total", "Messages received from each server.",
          counters.messagesReceived);
  counter("troupe_client_sent_bytes_total", "Bytes of messages sent to each server.",
          counters.bytesSent);
  counter("troupe_client_received_bytes_total", "Bytes of messages received from each server.",
          counters.bytesReceived);
  counter("troupe_client_large_messages_sent_total",
          "Messages of 64 KiB or more sent to each server.", counters.largeMessagesSent);
  counter("troupe_client_large_messages_received_total",
          "Messages of 64 KiB or more received from each server.", counters.largeMessagesReceived);
  counter("troupe_client_shared_messages_sent_total",
          "Messages sent to each server through shared memory (same host).",
          counters.sharedMessagesSent);
  counter("troupe_client_shared_messages_received_total",
          "Messages received from each server through shared memory (same host).",
          counters.sharedMessagesReceived);
}

Channel::~Channel() noexcept(false) {
  // A connection attempt refers to this channel; capabilities obtained from host() may outlive
  // it and keep the attempt's promise alive, so end the attempt itself now.
  connecting.cancel(makeError(ErrorCode::UNREACHABLE, kj::str("the channel to ", addressText,
                                                              " was closed before it connected")));
  // Capabilities and the connection go before the tasks that watch them.
  pending = nullptr;
  direct = nullptr;
  connection = nullptr;
  tasks = nullptr;
}

void Channel::dropIfClosing() {
  KJ_IF_MAYBE(c, connection) {
    if ((*c)->closing()) reset();
  }
}

capnp::Capability::Client Channel::bootstrapCapability() {
  dropIfClosing();
  KJ_IF_MAYBE(d, direct) {
    return *d;
  }
  if (pending == nullptr) startConnecting();
  return KJ_ASSERT_NONNULL(pending);
}

void Channel::disconnect() {
  if (pending != nullptr || direct != nullptr || connection != nullptr) reset();
}

void Channel::startConnecting() {
  uint64_t attempt = ++epoch_;
  auto connected =
      loop_.network()
          .parseAddress(address_.toKjAddress())
          .then([](kj::Own<kj::NetworkAddress> addr) {
            auto& ref = *addr;
            return ref.connect().attach(kj::mv(addr));
          })
          .then(
              [this](kj::Own<kj::AsyncIoStream> stream) -> kj::Promise<kj::Own<kj::AsyncIoStream>> {
                if (address_.kind != Address::Kind::TLS) return kj::mv(stream);
                return credentials_->wrapClient(loop_.timer(), kj::mv(stream), address_);
              })
          .then([this, attempt](kj::Own<kj::AsyncIoStream> stream) -> capnp::Capability::Client {
            if (attempt != epoch_) {
              // disconnect() was called while this attempt was under way: drop the stream.
              kj::throwFatalException(KJ_EXCEPTION(
                  DISCONNECTED, "the connection was dropped by disconnect() while it was made"));
            }
            auto conn = kj::heap<net_detail::RpcConnection>(kj::mv(stream), options.maxMessageBytes,
                                                            address_.kind != Address::Kind::TLS);
            conn->countInto(counters);
            if (address_.kind == Address::Kind::UNIX && options.sharedMemory) {
              conn->useSharedMemory(true, loop_.logger());
            }
            conn->onLargeMessageProgress([this](size_t bytes) {
              largeBytesMoved += bytes;
              largeLastMoved = loop_.timer().now();
            });
            ++connectionsMade_;
            // Every troupe server's bootstrap is an Authenticator; the service behind it is
            // asked for at once, and calls on it are pipelined behind the authentication.
            auto request = conn->bootstrap().castAs<schema::Authenticator>().authenticateRequest();
            request.setToken(credentials_->token());
            capnp::Capability::Client cap = request.send().getService();
            tasks->add(conn->onDisconnect().then([this, attempt]() {
              if (attempt == epoch_) reset();
            }));
            connection = kj::mv(conn);
            direct = cap;
            return cap;
          });
  auto timeout =
      loop_.timer().afterDelay(options.connectTimeout).then([this]() -> capnp::Capability::Client {
        kj::throwFatalException(KJ_EXCEPTION(DISCONNECTED, "timed out after",
                                             options.connectTimeout / kj::MILLISECONDS, "ms"));
      });
  auto guarded = connected.exclusiveJoin(kj::mv(timeout))
                     .catch_([this, attempt](kj::Exception&& e) -> capnp::Capability::Client {
                       if (attempt == epoch_) reset();
                       kj::throwFatalException(makeError(ErrorCode::UNREACHABLE,
                                                         kj::str("cannot connect to ", addressText,
                                                                 ": ", e.getDescription())));
                     });
  pending = capnp::Capability::Client(connecting.wrap(kj::mv(guarded)));
}

void Channel::reset() {
  ++epoch_;
  // Callers may be inside a continuation of the very objects dropped here: let them go on a
  // later turn.
  auto oldConnection = kj::mv(connection);
  auto oldPending = kj::mv(pending);
  auto oldDirect = kj::mv(direct);
  connection = nullptr;
  pending = nullptr;
  direct = nullptr;
  tasks->add(kj::evalLater(
      [c = kj::mv(oldConnection), p = kj::mv(oldPending), d = kj::mv(oldDirect)]() {}));
}

}  // namespace troupe
