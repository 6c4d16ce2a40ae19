#include "troupe/resolver/detail/registry_watch.h"

#include <set>

#include <kj/debug.h>
#include <kj/vector.h>
#include <spdlog/spdlog.h>

#include "troupe/base/errors.h"
#include "troupe/resolver/registry_wire.h"

namespace troupe::resolver_detail {

// The Watcher of one subscription. The registry holds it; Cap'n Proto releases it when the
// connection breaks or the registry drops the watch.
class SubscriptionWatcher final : public schema::Watcher::Server {
public:
  SubscriptionWatcher(RegistryWatch& watch, uint64_t id) : watch(watch), id(id) {}
  ~SubscriptionWatcher() noexcept(false) {
    KJ_IF_MAYBE(w, watch) {
      w->onWatcherReleased(id);
    }
  }
  KJ_DISALLOW_COPY(SubscriptionWatcher);

  void detach() { watch = nullptr; }

protected:
  kj::Promise<void> events(EventsContext context) override {
    KJ_IF_MAYBE(w, watch) {
      w->onEvents(id, context.getParams().getEvents());
    }
    return kj::READY_NOW;
  }

private:
  kj::Maybe<RegistryWatch&> watch;
  uint64_t id;
};

namespace {

using WatchResponse = capnp::Response<schema::Registry::WatchResults>;
using Type = WatchEvent::Type;

// Whether `now` says anything new about an endpoint reported as `before`. Its registration time
// alone does not: a registry that restarted registers the same incarnation again, later.
bool differs(const Endpoint& before, const Endpoint& now) {
  Endpoint same = now;
  same.registeredAtMillis = before.registeredAtMillis;
  return !(same == before);
}

}  // namespace

RegistryWatch::RegistryWatch(kj::Own<RegistryLink> link, kj::StringPtr prefix)
    : link(kj::mv(link)),
      prefix(prefix.cStr(), prefix.size()),
      tasks(kj::heap<kj::TaskSet>(static_cast<kj::TaskSet::ErrorHandler&>(*this))) {
  subscribe();
}

RegistryWatch::~RegistryWatch() noexcept(false) {
  detachWatcher();
  ++subscription;
  tasks = nullptr;
  handle = nullptr;  // ends the watch at the registry
}

void RegistryWatch::taskFailed(kj::Exception&& exception) {
  link->log->warn("watch on '{}': {}", prefix, exception.getDescription().cStr());
}

// ------------------------------------------------------------------------------------------------
// The user's side

kj::Promise<WatchEvent> RegistryWatch::next() { return events.next(); }

void RegistryWatch::push(WatchEvent event) { events.push(kj::mv(event)); }

// ------------------------------------------------------------------------------------------------
// Subscriptions

void RegistryWatch::subscribe() {
  phase = Phase::SUBSCRIBING;
  snapshot.clear();
  held.clear();
  uint64_t id = ++subscription;
  auto target = link->registry();
  subscriptionEpoch = link->epoch();
  auto object = kj::heap<SubscriptionWatcher>(*this, id);
  watcher = *object;
  auto request = target.watchRequest();
  request.setPrefix(prefix);
  request.setWatcher(kj::mv(object));
  tasks->add(link->withDeadline<WatchResponse>(request.send(), "watch")
                 .then(
                     [this, id](WatchResponse&& response) {
                       if (id == subscription) handle = response.getHandle();
                     },
                     [this, id](kj::Exception&& e) { lost(id, kj::mv(e)); }));
}

void RegistryWatch::onWatcherReleased(uint64_t id) {
  if (id == subscription) watcher = nullptr;  // it is being destroyed
  // Cap'n Proto may release the watcher deep inside its own bookkeeping: act on a later turn.
  tasks->add(kj::evalLater([this, id]() {
    // Not necessarily a broken connection (the registry may have dropped a watcher that fell
    // behind): the Channel notices a broken one by itself.
    lost(id, makeError(ErrorCode::FAILED, "the registry released the watcher"));
  }));
}

void RegistryWatch::detachWatcher() {
  KJ_IF_MAYBE(w, watcher) {
    w->detach();
  }
  watcher = nullptr;
}

void RegistryWatch::lost(uint64_t id, kj::Exception&& why) {
  if (id != subscription || phase == Phase::ENDED || phase == Phase::WAITING) return;
  detachWatcher();
  handle = nullptr;
  snapshot.clear();
  held.clear();
  missingSince.clear();  // the next snapshot decides about them afresh
  auto code = errorCode(why);
  // The registry refuses this prefix, or a watch that never got going is refused our
  // credentials: no point in asking again. (Refused after it ran, the registry's credentials
  // may be rotating: that one retries.)
  bool refusedCredentials = code == ErrorCode::UNAUTHENTICATED ||
                            code == ErrorCode::PERMISSION_DENIED;
  if (code == ErrorCode::INVALID_ARGUMENT || (refusedCredentials && !everSynced)) {
    link->log->warn("the registry at {} refused the watch on '{}': {}", link->addressText, prefix,
                    why.getDescription().cStr());
    phase = Phase::ENDED;
    ++subscription;
    events.end(kj::mv(why));
    return;
  }
  if (code == ErrorCode::DISCONNECTED || code == ErrorCode::DEADLINE_EXCEEDED) {
    link->connectionBroken(subscriptionEpoch);
  }

  phase = Phase::WAITING;
  uint64_t gen = ++subscription;
  // The first attempt at once (the registry may just have dropped this watch), then backoff.
  kj::Duration delay = failures == 0 ? 0 * kj::SECONDS : link->backoff(failures - 1);
  if (failures == 0 && everSynced) {
    link->log->info("watch on '{}' at the registry at {} lost ({}); subscribing again", prefix,
                    link->addressText, why.getDescription().cStr());
  } else if (failures == 0) {
    link->log->warn("cannot watch '{}' at the registry at {} ({}); retrying with backoff", prefix,
                    link->addressText, why.getDescription().cStr());
  } else {
    link->log->debug("watch on '{}': subscribing failed ({}); retrying in {} ms", prefix,
                     why.getDescription().cStr(), delay / kj::MILLISECONDS);
  }
  ++failures;
  tasks->add(link->loop.timer().afterDelay(delay).then([this, gen]() {
    if (gen == subscription && phase == Phase::WAITING) subscribe();
  }));
}

// ------------------------------------------------------------------------------------------------
// Events

void RegistryWatch::onEvents(uint64_t id, capnp::List<schema::WatchEvent>::Reader events) {
  for (auto e : events) {
    if (id != subscription) return;  // lost while dispatching
    KJ_IF_MAYBE(event, fromCapnp(e)) {
      dispatch(kj::mv(*event));
    }
  }
}

void RegistryWatch::dispatch(WatchEvent&& event) {
  switch (phase) {
    case Phase::SUBSCRIBING:
      switch (event.type) {
        case Type::ADDED:
        case Type::CHANGED:
          snapshot[event.endpoint.name] = kj::mv(event.endpoint);
          return;
        case Type::REMOVED:
          snapshot.erase(event.endpoint.name);
          return;
        case Type::JOB_ENDED:
          held.push_back(kj::mv(event));  // reported after SYNCED
          return;
        case Type::SYNCED:
          reconcile();
          return;
      }
      return;
    case Phase::SYNCING:
      held.push_back(kj::mv(event));
      return;
    case Phase::LIVE:
      liveEvent(kj::mv(event));
      return;
    case Phase::WAITING:
    case Phase::ENDED:
      return;
  }
}

void RegistryWatch::reconcile() {
  failures = 0;
  everSynced = true;
  std::set<std::string> removedJobs;
  std::map<std::string, Endpoint> missing;  // reported, and not in the registry's snapshot
  auto r = reported.begin();
  auto s = snapshot.begin();
  while (r != reported.end() || s != snapshot.end()) {
    if (s == snapshot.end() || (r != reported.end() && r->first < s->first)) {
      removedJobs.insert(r->second.jobId);
      missing.emplace(r->first, r->second);
      ++r;
    } else if (r == reported.end() || s->first < r->first) {
      push(WatchEvent{Type::ADDED, s->second, {}});
      ++s;
    } else {
      if (differs(r->second, s->second)) {
        push(WatchEvent{Type::CHANGED, s->second, {}});
      } else {
        s->second.registeredAtMillis = r->second.registeredAtMillis;  // keep the first
      }
      ++r;
      ++s;
    }
  }
  reported = kj::mv(snapshot);
  snapshot.clear();
  if (removedJobs.empty()) {
    finishSync(nullptr);
    return;
  }
  // Endpoints missing from a registry that just restarted are usually on their way back (their
  // registrations are retrying): they stay in the view, and are reported REMOVED only if they
  // are still missing after the grace period, or at once if their job ended.
  for (auto& [name, endpoint] : missing) reported.emplace(name, endpoint);
  missingSince = kj::mv(missing);

  // Endpoints went while this watch was away: if their job ended meanwhile, say so, as a live
  // watch would have.
  phase = Phase::SYNCING;
  uint64_t id = subscription;
  kj::Vector<kj::Promise<kj::Maybe<JobStatus>>> asks;
  for (auto& jobId : removedJobs) {
    kj::StringPtr job = jobId;
    if (!jobOverlapsPrefix(job, prefix)) continue;
    asks.add(link->call<capnp::Response<schema::Registry::JobStatusResults>>(
                     "jobStatus",
                     [jobId](schema::Registry::Client registry) {
                       auto request = registry.jobStatusRequest();
                       request.setJobId(jobId);
                       return request.send();
                     })
                 .then(
                     [](capnp::Response<schema::Registry::JobStatusResults>&& response)
                         -> kj::Maybe<JobStatus> {
                       auto status = fromCapnp(response.getStatus());
                       if (status.state != JobState::ENDED) return nullptr;
                       return kj::mv(status);
                     },
                     [](kj::Exception&&) -> kj::Maybe<JobStatus> { return nullptr; }));
  }
  tasks->add(kj::joinPromises(asks.releaseAsArray())
                 .then([this, id](kj::Array<kj::Maybe<JobStatus>> ended) {
                   if (id == subscription && phase == Phase::SYNCING) finishSync(ended);
                 }));
}

void RegistryWatch::finishSync(kj::ArrayPtr<kj::Maybe<JobStatus>> endedJobs) {
  std::set<std::string> ended;
  for (auto& job : endedJobs) {
    KJ_IF_MAYBE(status, job) {
      ended.insert(status->jobId);
    }
  }
  // The missing endpoints of jobs that ended go now, before the JOB_ENDED that explains them.
  for (auto it = missingSince.begin(); it != missingSince.end();) {
    if (ended.count(it->second.jobId) > 0) {
      reported.erase(it->first);
      push(WatchEvent{Type::REMOVED, kj::mv(it->second), {}});
      it = missingSince.erase(it);
    } else {
      ++it;
    }
  }
  for (auto& job : endedJobs) {
    KJ_IF_MAYBE(status, job) {
      push(WatchEvent{Type::JOB_ENDED, {}, kj::mv(*status)});
    }
  }
  if (!missingSince.empty()) {
    uint64_t id = subscription;
    tasks->add(link->loop.timer().afterDelay(link->options.reconcileGrace).then([this, id]() {
      if (id == subscription) removeStillMissing();
    }));
  }
  push(WatchEvent{Type::SYNCED, {}, {}});
  phase = Phase::LIVE;
  auto pending = kj::mv(held);
  held.clear();
  for (auto& event : pending) liveEvent(kj::mv(event));
}

void RegistryWatch::removeStillMissing() {
  auto missing = kj::mv(missingSince);
  missingSince.clear();
  for (auto& [name, endpoint] : missing) {
    if (reported.erase(name) > 0) push(WatchEvent{Type::REMOVED, kj::mv(endpoint), {}});
  }
}

void RegistryWatch::liveEvent(WatchEvent&& event) {
  if (event.type != Type::JOB_ENDED && event.type != Type::SYNCED) {
    missingSince.erase(event.endpoint.name);  // back (or gone for good) within the grace
  }
  switch (event.type) {
    case Type::ADDED:
    case Type::CHANGED: {
      auto it = reported.find(event.endpoint.name);
      if (it == reported.end()) {
        reported.emplace(event.endpoint.name, event.endpoint);
        push(WatchEvent{Type::ADDED, kj::mv(event.endpoint), {}});
      } else if (differs(it->second, event.endpoint)) {
        it->second = event.endpoint;
        push(WatchEvent{Type::CHANGED, kj::mv(event.endpoint), {}});
      }
      return;
    }
    case Type::REMOVED:
      if (reported.erase(event.endpoint.name) > 0) push(kj::mv(event));
      return;
    case Type::JOB_ENDED:
      // Its endpoints still in their grace are gone for good: say so before the JOB_ENDED.
      for (auto it = missingSince.begin(); it != missingSince.end();) {
        if (it->second.jobId == event.job.jobId) {
          if (reported.erase(it->first) > 0) {
            push(WatchEvent{Type::REMOVED, kj::mv(it->second), {}});
          }
          it = missingSince.erase(it);
        } else {
          ++it;
        }
      }
      push(kj::mv(event));
      return;
    case Type::SYNCED:
      push(kj::mv(event));
      return;
  }
}

}  // namespace troupe::resolver_detail
