#pragma once
// The connection a RegistryResolver and everything it hands out share: one Channel to the
// registry, call deadlines, the reconnect backoff, and the liveness watch that tells
// registrations at once when the connection breaks.

#include <map>
#include <string>

#include <kj/async.h>
#include <kj/list.h>
#include <kj/refcount.h>

#include "troupe/base/backoff.h"
#include "troupe/base/errors.h"
#include "troupe/net/channel.h"
#include "troupe/net/credentials.h"
#include "troupe/resolver/registry_resolver.h"
#include "troupe/schemas/registry.capnp.h"

namespace troupe::resolver_detail {

// The prefix of the liveness watch: '~' cannot start an endpoint name (nor a job id), so it
// matches nothing and the registry never sends it more than SYNCED.
constexpr kj::StringPtr LIVENESS_PREFIX = "~troupe.liveness"_kj;

// Told when the connection is found broken. Registered with RegistryLink::addListener; must
// remove itself before it goes.
class ConnectionListener {
public:
  virtual ~ConnectionListener() noexcept(false) = default;

  // The connection of some epoch broke (the link's epoch() has moved on). Called on a later
  // turn than the one that found out, never from inside another link call.
  virtual void connectionLost() = 0;

  kj::ListLink<ConnectionListener> listenerLink;
};

class LivenessProbe;

// Shared (kj::addRef) by the resolver, its registrations and its watches; the last one to go
// closes the connection. Loop thread only.
class RegistryLink final : public kj::Refcounted, private kj::TaskSet::ErrorHandler {
public:
  // `address` is the registry's troupe address (tcp:// or unix:).
  RegistryLink(EventLoop& loop, kj::StringPtr address, RegistryResolverOptions options);
  ~RegistryLink() noexcept(false);
  KJ_DISALLOW_COPY(RegistryLink);

  // The registry on the current connection, connecting if there is none (calls made meanwhile
  // wait; they fail with UNREACHABLE if the connection cannot be made).
  schema::Registry::Client registry();

  // Identifies the current connection (or connection attempt); changes when it is replaced.
  uint64_t epoch() const { return channel->epoch(); }

  // What the channel presents; its job token goes with every registration.
  const Credentials& credentials() const { return channel->credentials(); }

  // A call on the connection of `epoch` failed with DISCONNECTED: drops that connection if it
  // is still the current one, so the next call connects again.
  void connectionBroken(uint64_t epoch);

  // `promise`, rejected with DEADLINE_EXCEEDED (naming `what`) if it has not settled within
  // options.callTimeout.
  template <typename T>
  kj::Promise<T> withDeadline(kj::Promise<T> promise, kj::StringPtr what);

  // A one-shot idempotent call: `fn(registry())` with the deadline, sent once more on a fresh
  // connection when it fails with DISCONNECTED (the connection it used had broken).
  template <typename T, typename Fn>
  kj::Promise<T> call(kj::StringPtr what, Fn fn, bool mayRetry = true);

  // The delay before retry number `attempt` (0 for the first): the reconnect backoff, jittered
  // from the loop's random source.
  kj::Duration backoff(uint32_t attempt) { return reconnect.delay(attempt, loop.random()); }

  // How long between lease renewals, given the TTL the registry granted (0 when not known yet).
  kj::Duration renewInterval(kj::Duration granted) const;

  void addListener(ConnectionListener& listener);
  void removeListener(ConnectionListener& listener);

  // Makes sure the liveness watch runs on the current connection while listeners exist.
  // Registrations call it after each successful registration.
  void ensureProbe();

  // Called by the probe's Watcher object when Cap'n Proto releases it.
  void probeReleased(uint64_t id);

  EventLoop& loop;
  const RegistryResolverOptions options;
  const std::shared_ptr<spdlog::logger> log;
  const std::string addressText;

private:
  void taskFailed(kj::Exception&& exception) override;
  void probeLost(uint64_t id, kj::StringPtr why);
  void stopProbe();

  kj::Own<Channel> channel;
  const Backoff reconnect;
  kj::List<ConnectionListener, &ConnectionListener::listenerLink> listeners;

  bool probeActive = false;         // a probe watches connection `probeEpoch`
  bool probeRefused = false;        // the registry refused it: no more attempts
  kj::Maybe<LivenessProbe&> probe;  // its Watcher object, until Cap'n Proto releases it
  kj::Maybe<schema::WatchHandle::Client> probeHandle;
  uint64_t probeId = 0;
  uint64_t probeEpoch = 0;

  kj::Own<kj::TaskSet> tasks;
};

// ---------------------------------------------------------------------------------------------

template <typename T>
kj::Promise<T> RegistryLink::withDeadline(kj::Promise<T> promise, kj::StringPtr what) {
  auto timeout = options.callTimeout;
  auto expired = loop.timer().afterDelay(timeout).then(
      [what = kj::str(what), address = kj::str(addressText), timeout]() -> kj::Promise<T> {
        return makeError(ErrorCode::DEADLINE_EXCEEDED,
                         kj::str("the registry at ", address, " did not answer ", what, " within ",
                                 timeout / kj::MILLISECONDS, " ms"));
      });
  return promise.exclusiveJoin(kj::mv(expired));
}

template <typename T, typename Fn>
kj::Promise<T> RegistryLink::call(kj::StringPtr what, Fn fn, bool mayRetry) {
  auto target = registry();
  uint64_t used = epoch();
  auto promise = withDeadline(kj::evalNow([&]() -> kj::Promise<T> { return fn(target); }), what);
  return promise.catch_([self = kj::addRef(*this), what = kj::str(what), fn = kj::mv(fn), used,
                         mayRetry](kj::Exception&& e) mutable -> kj::Promise<T> {
    if (errorCode(e) != ErrorCode::DISCONNECTED) return kj::mv(e);
    self->connectionBroken(used);
    if (!mayRetry) return kj::mv(e);
    return self->call<T>(what, kj::mv(fn), false);
  });
}

}  // namespace troupe::resolver_detail
