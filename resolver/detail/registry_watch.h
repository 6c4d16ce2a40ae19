#pragma once
// A RegistryResolver watch: a Watcher capability the registry pushes to, re-subscribed after the
// connection breaks, with what the user has been told reconciled against each new snapshot.

#include <deque>
#include <map>
#include <string>

#include <kj/async.h>

#include "troupe/resolver/detail/registry_link.h"
#include "troupe/resolver/detail/watch_queue.h"
#include "troupe/resolver/resolver.h"

namespace troupe::resolver_detail {

class SubscriptionWatcher;

// Loop thread only. See RegistryResolver::watch for the contract.
class RegistryWatch final : public Watch, private kj::TaskSet::ErrorHandler {
public:
  // Subscribes at once. `prefix` is already validated.
  RegistryWatch(kj::Own<RegistryLink> link, kj::StringPtr prefix);
  ~RegistryWatch() noexcept(false);
  KJ_DISALLOW_COPY(RegistryWatch);

  kj::Promise<WatchEvent> next() override;

  // From the Watcher object of subscription `id`: a batch the registry pushed.
  void onEvents(uint64_t id, capnp::List<schema::WatchEvent>::Reader events);

  // From the Watcher object of subscription `id`: Cap'n Proto released it (the connection
  // broke or the registry dropped the watch).
  void onWatcherReleased(uint64_t id);

private:
  enum class Phase : uint8_t {
    SUBSCRIBING,  // collecting the registry's snapshot until its SYNCED
    SYNCING,      // reconciled; asking which jobs of removed endpoints ended
    LIVE,         // passing changes on
    WAITING,      // waiting out the backoff before subscribing again
    ENDED,        // the registry refused the watch
  };

  void taskFailed(kj::Exception&& exception) override;

  void subscribe();
  void lost(uint64_t id, kj::Exception&& why);
  void detachWatcher();
  void dispatch(WatchEvent&& event);
  void reconcile();
  void finishSync(kj::ArrayPtr<kj::Maybe<JobStatus>> endedJobs);
  void removeStillMissing();
  void liveEvent(WatchEvent&& event);
  void push(WatchEvent event);

  kj::Own<RegistryLink> link;
  std::string prefix;
  Phase phase = Phase::WAITING;

  std::map<std::string, Endpoint> reported;  // the view the events pushed so far describe
  std::map<std::string, Endpoint> snapshot;  // the registry's view, while SUBSCRIBING
  std::deque<WatchEvent> held;               // events that arrived while SYNCING
  // Reported endpoints the last snapshot lacked, REMOVED once the grace passes without them.
  std::map<std::string, Endpoint> missingSince;

  uint64_t subscription = 0;  // the current subscription; events of older ones are ignored
  uint64_t subscriptionEpoch = 0;
  kj::Maybe<SubscriptionWatcher&> watcher;
  kj::Maybe<schema::WatchHandle::Client> handle;
  uint32_t failures = 0;  // subscriptions lost since the last SYNCED
  bool everSynced = false;

  WatchQueue events;

  kj::Own<kj::TaskSet> tasks;
};

}  // namespace troupe::resolver_detail
