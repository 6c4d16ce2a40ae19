#pragma once
// Channel: the connection to one ActorServer address, made when first needed and made again
// after it breaks. ActorRefs to actors at the same address can share one.

#include <memory>
#include <string>

#include <kj/async.h>
#include <kj/refcount.h>

#include "troupe/base/event_loop.h"
#include "troupe/base/metrics.h"
#include "troupe/net/address.h"
#include "troupe/net/credentials.h"
#include "troupe/net/limits.h"
#include "troupe/schemas/actor.capnp.h"

namespace troupe {

namespace net_detail {
class RpcConnection;
}

struct ChannelOptions {
  // Largest message sent or accepted, in bytes; must match the server's. Default 512 MiB.
  uint64_t maxMessageBytes = DEFAULT_MAX_MESSAGE_BYTES;

  // How long a connection attempt (the TLS handshake included) may take before calls waiting
  // on it fail with UNREACHABLE. Default 10 s.
  kj::Duration connectTimeout = 10 * kj::SECONDS;

  // What the channel verifies a tls:// server with and presents to servers (TLS client
  // certificate, cluster token). Default: null, meaning the loop's (loopCredentials(),
  // net/credentials.h).
  std::shared_ptr<Credentials> credentials;
  // Over a unix socket to a server of this user, large messages (64 KiB or more) go through
  // shared memory rather than the socket's buffers (README, "Same host"). Default true; false
  // keeps every byte on the socket.
  bool sharedMemory = true;
};

// Belongs to the loop it was opened on. Shared by reference counting (addRef()); the last
// reference closes the connection, failing calls still in flight with DISCONNECTED.
//
// It counts what crosses its connections (metrics.h), in its loop's metrics labelled with the
// server's address as `peer`: troupe_client_connections_total, troupe_client_connected,
// troupe_client_messages_{sent,received}_total, troupe_client_{sent,received}_bytes_total and
// troupe_client_large_messages_{sent,received}_total (64 KiB or more) and
// troupe_client_shared_messages_{sent,received}_total (of those, through shared memory).
class Channel final : public kj::Refcounted, public MetricsSource {
public:
  // Throws INVALID_ARGUMENT for a malformed address. Does not connect yet.
  static kj::Own<Channel> open(EventLoop& loop, kj::StringPtr address, ChannelOptions options = {});

  Channel(EventLoop& loop, Address address, ChannelOptions options);
  ~Channel() noexcept(false);
  KJ_DISALLOW_COPY(Channel);

  kj::Own<Channel> addRef() { return kj::addRef(*this); }

  // The server's service, as interface T: the ActorHost of an ActorServer, the Registry of a
  // RegistryServer, obtained from its Authenticator with the credentials' cluster token. Starts
  // connecting if there is no connection; calls made before it is up wait for it, and fail with
  // UNREACHABLE if it cannot be made (the next call tries again), or with UNAUTHENTICATED when
  // the server refuses the token (every call on this connection does). After a disconnect, calls on
  // a capability obtained earlier fail with DISCONNECTED; ask again for the new connection. A T the
  // server does not implement fails its calls with UNIMPLEMENTED.
  template <typename T>
  typename T::Client bootstrap() {
    return bootstrapCapability().castAs<T>();
  }

  // bootstrap<schema::ActorHost>(): the ActorHost of the ActorServer at the address.
  schema::ActorHost::Client host() { return bootstrap<schema::ActorHost>(); }

  // Changes whenever the connection is replaced or lost: a capability obtained through host()
  // (or from the server through it) is current while epoch() returns what it did then.
  uint64_t epoch() const { return epoch_; }

  // Drops the connection if it is already going down (the peer aborted it, or it failed) though
  // the channel has not seen it go yet: the calls that failed with it learn first, and one made
  // right after them connects again instead of failing with the old connection's error. A new
  // epoch follows.
  void dropIfClosing();

  // Drops the current connection (calls in flight on it fail with DISCONNECTED).
  void disconnect();

  // What the channel presents (ChannelOptions::credentials, or the loop's).
  const Credentials& credentials() const { return *credentials_; }

  // Where the channel connects, and the loop it belongs to.
  const Address& address() const { return address_; }
  EventLoop& loop() { return loop_; }

  // What crossed its connections so far, and how many it made.
  const TransportCounters& transport() const { return counters; }
  uint64_t connectionsMade() const { return connectionsMade_; }

  // The largest message it sends or accepts (ChannelOptions::maxMessageBytes).
  uint64_t maxMessageBytes() const { return options.maxMessageBytes; }

  // Bytes of large messages (those that pass the small-message buffers: over 8 KiB read, over
  // 16 KiB written) moved so far over its connections, either way, counted while they move
  // rather than once a message is whole; and when some last moved (by the loop's timer), null
  // before any did. A connection moving a large message delays whatever was sent behind it (a
  // ping, a small call) however alive the peer is, which these tell.
  uint64_t largeMessageBytesMoved() const { return largeBytesMoved; }
  kj::Maybe<kj::TimePoint> largeMessageLastMoved() const { return largeLastMoved; }

  void collectMetrics(MetricsSnapshot& out) const override;

private:
  class ErrorHandler;
  capnp::Capability::Client bootstrapCapability();
  void startConnecting();
  void reset();

  EventLoop& loop_;
  Address address_;
  std::string addressText;
  ChannelOptions options;
  std::shared_ptr<Credentials> credentials_;  // never null
  uint64_t epoch_ = 0;
  kj::Maybe<capnp::Capability::Client> pending;  // while connecting: queues calls
  kj::Maybe<capnp::Capability::Client> direct;   // once connected
  kj::Maybe<kj::Own<net_detail::RpcConnection>> connection;
  kj::Own<ErrorHandler> errorHandler;
  kj::Own<kj::TaskSet> tasks;
  kj::Canceler connecting;  // the connection attempt, which refers to this channel
  TransportCounters counters;
  uint64_t largeBytesMoved = 0;
  kj::Maybe<kj::TimePoint> largeLastMoved;
  uint64_t connectionsMade_ = 0;
  MetricsSet::Registration metricsRegistration;  // last: goes first
};

}  // namespace troupe
