#include "troupe/resolver/detail/registry_link.h"

#include <kj/debug.h>
#include <kj/vector.h>
#include <spdlog/spdlog.h>

namespace troupe::resolver_detail {

// The Watcher of the liveness watch. Cap'n Proto releases it when the connection breaks (or
// the registry drops the watch), which is the point of it.
class LivenessProbe final : public schema::Watcher::Server {
public:
  LivenessProbe(RegistryLink& link, uint64_t id) : link(link), id(id) {}
  ~LivenessProbe() noexcept(false) {
    KJ_IF_MAYBE(l, link) {
      l->probeReleased(id);
    }
  }
  KJ_DISALLOW_COPY(LivenessProbe);

  void detach() { link = nullptr; }

protected:
  kj::Promise<void> events(EventsContext) override { return kj::READY_NOW; }

private:
  kj::Maybe<RegistryLink&> link;
  uint64_t id;
};

namespace {

ChannelOptions channelOptions(const RegistryResolverOptions& options) {
  ChannelOptions result;
  result.maxMessageBytes = options.maxMessageBytes;
  result.connectTimeout = options.callTimeout;
  result.credentials = options.credentials;
  return result;
}

}  // namespace

RegistryLink::RegistryLink(EventLoop& loop, kj::StringPtr address, RegistryResolverOptions options)
    : loop(loop),
      options(kj::mv(options)),
      log(this->options.logger ? this->options.logger : loop.logger()),
      addressText(Address::parse(address).toString()),
      channel(Channel::open(loop, address, channelOptions(this->options))),
      reconnect(this->options.reconnectBackoffInitial, this->options.reconnectBackoffMax,
                "RegistryResolverOptions' reconnectBackoffInitial and reconnectBackoffMax"),
      tasks(kj::heap<kj::TaskSet>(static_cast<kj::TaskSet::ErrorHandler&>(*this))) {
  KJ_REQUIRE(this->options.ttl >= 0 * kj::SECONDS,
             "RegistryResolverOptions: ttl must not be negative");
}

RegistryLink::~RegistryLink() noexcept(false) {
  KJ_ASSERT(listeners.empty(), "a registration outlived its RegistryLink");
  stopProbe();
  tasks = nullptr;
}

void RegistryLink::taskFailed(kj::Exception&& exception) {
  log->warn("registry client task failed: {}", exception.getDescription().cStr());
}

schema::Registry::Client RegistryLink::registry() { return channel->bootstrap<schema::Registry>(); }

void RegistryLink::connectionBroken(uint64_t brokenEpoch) {
  if (channel->epoch() == brokenEpoch) channel->disconnect();
}

kj::Duration RegistryLink::renewInterval(kj::Duration granted) const {
  // What the registry granted, else what was asked for, else the registry's usual default.
  kj::Duration ttl = granted > 0 * kj::SECONDS       ? granted
                     : options.ttl > 0 * kj::SECONDS ? options.ttl
                                                     : 10 * kj::SECONDS;
  auto interval = options.renewInterval > 0 * kj::SECONDS ? options.renewInterval : ttl / 3;
  if (ttl / 3 < interval) interval = ttl / 3;
  return interval;
}

void RegistryLink::addListener(ConnectionListener& listener) { listeners.add(listener); }

void RegistryLink::removeListener(ConnectionListener& listener) {
  listeners.remove(listener);
  if (listeners.empty()) stopProbe();
}

void RegistryLink::ensureProbe() {
  if (listeners.empty() || probeRefused) return;
  if (probeActive) {
    if (probeEpoch == channel->epoch()) return;
    // It watches a connection that has been replaced: whoever relied on that one must hear.
    probeLost(probeId, "the connection was replaced");
  }
  probeActive = true;
  auto target = registry();
  probeEpoch = channel->epoch();
  uint64_t id = ++probeId;
  auto watcher = kj::heap<LivenessProbe>(*this, id);
  probe = *watcher;
  auto request = target.watchRequest();
  request.setPrefix(LIVENESS_PREFIX);
  request.setWatcher(kj::mv(watcher));
  tasks->add(withDeadline<capnp::Response<schema::Registry::WatchResults>>(request.send(), "watch")
                 .then(
                     [this, id](capnp::Response<schema::Registry::WatchResults>&& response) {
                       if (id == probeId) probeHandle = response.getHandle();
                     },
                     [this, id](kj::Exception&& e) {
                       auto code = errorCode(e);
                       if (code == ErrorCode::DISCONNECTED || code == ErrorCode::UNREACHABLE ||
                           code == ErrorCode::DEADLINE_EXCEEDED) {
                         probeLost(id, e.getDescription());
                       } else if (id == probeId) {
                         // A registry that refuses the watch: registrations then learn of a
                         // broken connection at their next renewal instead.
                         log->warn("the registry at {} refused the liveness watch ({}); lost "
                                   "connections will be noticed at the next renewal",
                                   addressText, e.getDescription().cStr());
                         stopProbe();
                         probeRefused = true;
                       }
                     }));
}

void RegistryLink::probeReleased(uint64_t id) {
  if (id == probeId) probe = nullptr;  // it is being destroyed
  // Cap'n Proto may release the probe deep inside its own bookkeeping: act on a later turn.
  tasks->add(kj::evalLater([this, id]() { probeLost(id, "its liveness watch ended"); }));
}

void RegistryLink::probeLost(uint64_t id, kj::StringPtr why) {
  if (id != probeId || !probeActive) return;
  uint64_t lostEpoch = probeEpoch;
  stopProbe();
  log->info("connection to the registry at {} lost ({}); registering again", addressText,
            why.cStr());
  connectionBroken(lostEpoch);
  kj::Vector<ConnectionListener*> toTell;
  for (auto& l : listeners) toTell.add(&l);
  tasks->add(kj::evalLater([this, toTell = kj::mv(toTell)]() {
    for (auto* l : toTell) {
      // Skip listeners that went meanwhile.
      for (auto& current : listeners) {
        if (&current == l) {
          l->connectionLost();
          break;
        }
      }
    }
  }));
}

void RegistryLink::stopProbe() {
  KJ_IF_MAYBE(p, probe) {
    p->detach();
  }
  probe = nullptr;
  probeHandle = nullptr;
  probeActive = false;
  ++probeId;
}

}  // namespace troupe::resolver_detail
