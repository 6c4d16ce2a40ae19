#include "troupe/pool/actor_group.h"

#include <set>

#include <kj/debug.h>
#include <kj/vector.h>
#include <spdlog/spdlog.h>

#include "troupe/base/change_signal.h"
#include "troupe/base/errors.h"

namespace troupe {

namespace {

// Members' handles count nothing themselves: the pool calling them counts each attempt by member.
ActorRefOptions memberRefOptions() {
  ActorRefOptions options;
  options.metrics = false;
  return options;
}

}  // namespace

struct ActorGroupBase::Impl final : public kj::TaskSet::ErrorHandler {
  Impl(EventLoop& loop, Resolver& resolver, kj::StringPtr jobId, kj::StringPtr actor,
       ActorGroupOptions options)
      : loop(loop),
        resolver(resolver),
        jobId(jobId.cStr()),
        actor(actor.cStr()),
        options(kj::mv(options)),
        log(this->options.logger ? this->options.logger : loop.logger()),
        tasks(*this) {
    validateJobId(jobId);
    validateActorName(actor);
    prefix = this->jobId + "/" + this->actor + "-";
    watch = resolver.watch(prefix);
    tasks.add(watchLoop());
    tasks.add(resolver.jobStatus(jobId).then(
        [this](JobStatus status) {
          if (status.state == JobState::ENDED) jobHasEnded(kj::mv(status));
        },
        [this](kj::Exception&& e) {
          log->warn("group {}: {}", prefix, e.getDescription().cStr());
          unanswered = kj::mv(e);
        }));
  }

  ~Impl() noexcept(false) {
    // Waits handed out refer to the group.
    waits.cancel(makeError(ErrorCode::FAILED, kj::str("the group ", prefix,
                                                      "* was destroyed while a wait on it "
                                                      "was pending")));
    // Members (and their connections) before the tasks that reference them.
    ready.clear();
    members.clear();
    channels.clear();
  }

  void taskFailed(kj::Exception&& e) override {
    log->warn("group {}: {}", prefix, e.getDescription().cStr());
  }

  // --- membership

  kj::Promise<void> watchLoop() {
    return watch->next().then(
        [this](WatchEvent&& event) {
          apply(kj::mv(event));
          return watchLoop();
        },
        [this](kj::Exception&& e) {
          log->error("group {}: the resolver's watch ended: {}", prefix, e.getDescription().cStr());
          broken = kj::mv(e);
          changed();
        });
  }

  // Whether `endpoint` belongs to this group (the prefix also matches "ps-x-0" for actor "ps").
  bool isMember(const Endpoint& endpoint) const {
    return endpoint.jobId == jobId && endpoint.actor == actor;
  }

  void apply(WatchEvent event) {
    switch (event.type) {
      case WatchEvent::Type::ADDED:
      case WatchEvent::Type::CHANGED:
        if (isMember(event.endpoint)) upsert(kj::mv(event.endpoint));
        break;
      case WatchEvent::Type::REMOVED:
        if (isMember(event.endpoint)) erase(event.endpoint.name);
        break;
      case WatchEvent::Type::SYNCED:
        synced = true;
        break;
      case WatchEvent::Type::JOB_ENDED:
        if (event.job.jobId == jobId) jobHasEnded(kj::mv(event.job));
        break;
    }
    changed();
  }

  void upsert(Endpoint endpoint) {
    KJ_IF_MAYBE(e, ended) {
      log->info("group {}: job {} runs again ({} registered after it ended: {})", prefix, jobId,
                endpoint.name, e->reason);
      ended = nullptr;
      lastSeen.clear();
    }
    lastSeen[endpoint.name] = endpoint.state;
    auto it = members.find(endpoint.name);
    if (it == members.end()) {
      log->debug("group {}: {} joined at {} ({})", prefix, endpoint.name, endpoint.address,
                 toString(endpoint.state).cStr());
      auto ref = ActorRefBase(channelFor(addressOf(endpoint)), actor, memberRefOptions());
      auto name = endpoint.name;
      members.emplace(name, kj::refcounted<GroupMember>(kj::mv(endpoint), kj::mv(ref)));
      return;
    }
    // Members handed out are snapshots: the changed member is a new one.
    auto& old = it->second;
    // The same connection when the member is reached where it was (the same published address,
    // or the same same-host socket).
    auto address = addressOf(endpoint);
    auto channel = channels.find(address);
    auto ref = channel != channels.end() && channel->second.get() == &old->ref.channel()
                   ? old->ref
                   : ActorRefBase(channelFor(address), actor, memberRefOptions());
    old = kj::refcounted<GroupMember>(kj::mv(endpoint), kj::mv(ref));
    dropUnusedChannels();
  }

  void erase(const std::string& name) {
    if (members.erase(name) > 0) {
      log->debug("group {}: {} left", prefix, name);
      dropUnusedChannels();
    }
  }

  // Where the group connects to `endpoint`.
  std::string addressOf(const Endpoint& endpoint) const {
    return options.sameHost ? connectAddress(endpoint) : endpoint.address;
  }

  kj::Own<Channel> channelFor(const std::string& address) {
    auto it = channels.find(address);
    if (it == channels.end()) {
      it = channels.emplace(address, Channel::open(loop, address, options.channel)).first;
    }
    return it->second->addRef();
  }

  void dropUnusedChannels() {
    std::set<const Channel*> used;
    for (auto& [name, m] : members) used.insert(&m->ref.channel());
    for (auto it = channels.begin(); it != channels.end();) {
      it = used.count(it->second.get()) ? std::next(it) : channels.erase(it);
    }
  }

  void jobHasEnded(JobStatus status) {
    if (ended != nullptr) return;
    log->info("group {}: job {} ended ({})", prefix, status.jobId, status.reason);
    ended = kj::mv(status);
    changed();
  }

  void changed() {
    ready.clear();
    for (auto& [name, m] : members) {
      if (m->endpoint.state == EndpointState::READY) ready.push_back(m.get());
    }
    changeSignal.notify();
  }

  kj::Promise<void> whenChanged() { return changeSignal.next(); }

  kj::Promise<void> whenSynced() {
    KJ_IF_MAYBE(e, broken) {
      return kj::cp(*e);
    }
    if (synced) return kj::READY_NOW;
    return whenChanged().then([this]() { return whenSynced(); });
  }

  // --- waiting

  kj::String describeMembers() const {
    if (members.empty()) return kj::str("none registered");
    kj::Vector<kj::String> parts;
    for (auto& [name, m] : members) {
      parts.add(kj::str(name, " ", toString(m->endpoint.state)));
    }
    return kj::str("registered: ", kj::strArray(parts, ", "));
  }

  // What registered since the job (last) started, with each member's last state: ending a job
  // removes its endpoints before the group hears that it ended.
  kj::String describeEnded(size_t count) const {
    size_t wasReady = 0;
    kj::Vector<kj::String> parts;
    for (auto& [name, state] : lastSeen) {
      if (state == EndpointState::READY) ++wasReady;
      parts.add(kj::str(name, " ", toString(state)));
    }
    if (parts.empty()) return kj::str("none of the ", count, " wanted members had registered");
    return kj::str(wasReady, " of the ", count, " wanted members were ready before it ended; ",
                   parts.size(), " had registered (", kj::strArray(parts, ", "), ")");
  }

  kj::Promise<kj::Array<Endpoint>> waitReady(size_t count, kj::TimePoint deadline,
                                             kj::Duration timeout) {
    KJ_IF_MAYBE(e, ended) {
      return makeError(ErrorCode::JOB_ENDED,
                       kj::str("job '", jobId, "' ended (", e->reason, ") while waiting for ",
                               count, " members of ", prefix, ": ", describeEnded(count)));
    }
    KJ_IF_MAYBE(e, broken) {
      return kj::cp(*e);
    }
    if (ready.size() >= count) {
      auto result = kj::heapArrayBuilder<Endpoint>(count);
      for (size_t i = 0; i < count; ++i) {
        handedOut.insert({ready[i]->endpoint.name, ready[i]->endpoint.incarnation});
        result.add(ready[i]->endpoint);
      }
      return result.finish();
    }
    auto expired = loop.timer().atTime(deadline).then([this, count,
                                                       timeout]() -> kj::Promise<void> {
      if (!synced) {
        // Not "none registered": the resolver never said what is registered.
        KJ_IF_MAYBE(e, unanswered) {
          if (errorCode(*e) == ErrorCode::UNREACHABLE) {
            return makeError(ErrorCode::UNREACHABLE,
                             kj::str("no member of ", prefix, " after ", timeout / kj::MILLISECONDS,
                                     " ms: the resolver cannot be reached (", errorMessage(*e),
                                     ")"));
          }
        }
        return makeError(ErrorCode::DEADLINE_EXCEEDED,
                         kj::str("no member of ", prefix, " after ", timeout / kj::MILLISECONDS,
                                 " ms: the resolver has not answered"));
      }
      return makeError(ErrorCode::DEADLINE_EXCEEDED,
                       kj::str("only ", ready.size(), " of the ", count, " wanted members of ",
                               prefix, " were ready after ", timeout / kj::MILLISECONDS, " ms; ",
                               describeMembers()));
    });
    return whenChanged().exclusiveJoin(kj::mv(expired)).then([this, count, deadline, timeout]() {
      return waitReady(count, deadline, timeout);
    });
  }

  EventLoop& loop;
  Resolver& resolver;
  std::string jobId;
  std::string actor;
  std::string prefix;
  ActorGroupOptions options;
  std::shared_ptr<spdlog::logger> log;

  kj::Own<Watch> watch;
  std::map<std::string, kj::Own<Channel>> channels;      // by address
  std::map<std::string, kj::Own<GroupMember>> members;   // by name
  std::map<std::string, EndpointState> lastSeen;         // since the job (last) started
  std::vector<GroupMember*> ready;                       // READY members, by name
  std::set<std::pair<std::string, uint64_t>> handedOut;  // (name, incarnation)
  kj::Maybe<JobStatus> ended;
  kj::Maybe<kj::Exception> broken;
  bool synced = false;                  // the watch reported its snapshot
  kj::Maybe<kj::Exception> unanswered;  // why the resolver did not answer the job's status
  ChangeSignal changeSignal;
  kj::Canceler waits;  // waitReady() promises, which refer to the group
  kj::TaskSet tasks;
};

ActorGroupBase::ActorGroupBase(EventLoop& loop, Resolver& resolver, kj::StringPtr jobId,
                               kj::StringPtr actor, ActorGroupOptions options)
    : impl(kj::heap<Impl>(loop, resolver, jobId, actor, kj::mv(options))) {}

ActorGroupBase::~ActorGroupBase() noexcept(false) {}

kj::Promise<kj::Array<Endpoint>> ActorGroupBase::waitReady(size_t count, kj::Duration timeout) {
  return impl->waits.wrap(impl->waitReady(count, impl->loop.timer().now() + timeout, timeout));
}

kj::Array<Endpoint> ActorGroupBase::discoverNew() {
  kj::Vector<Endpoint> fresh;
  for (auto* m : impl->ready) {
    if (impl->handedOut.insert({m->endpoint.name, m->endpoint.incarnation}).second) {
      fresh.add(m->endpoint);
    }
  }
  return fresh.releaseAsArray();
}

size_t ActorGroupBase::readyCount() const { return impl->ready.size(); }

kj::Array<Endpoint> ActorGroupBase::members() const {
  kj::Vector<Endpoint> all;
  for (auto& [name, m] : impl->members) all.add(m->endpoint);
  return all.releaseAsArray();
}

kj::Promise<void> ActorGroupBase::drainMembers(kj::Maybe<kj::Duration> grace) {
  uint32_t millis = 0;
  KJ_IF_MAYBE(g, grace) {
    millis = static_cast<uint32_t>(*g / kj::MILLISECONDS);
  }
  kj::Vector<kj::Promise<void>> requests;
  for (auto& [name, m] : impl->members) {
    auto& channel = m->ref.channel();
    auto request = channel.host().drainRequest();
    request.setGraceMillis(millis);
    request.setJobCredential(channel.credentials().jobTokenFor(impl->jobId));
    requests.add(
        request.send().ignoreResult().catch_([log = impl->log, name = name](kj::Exception&& e) {
          log->warn("asking {} to drain: {}", name, e.getDescription().cStr());
        }));
  }
  return kj::joinPromises(requests.releaseAsArray());
}

kj::Maybe<const JobStatus&> ActorGroupBase::jobEnded() const { return impl->ended; }

kj::Promise<void> ActorGroupBase::whenChanged() { return impl->whenChanged(); }

kj::Promise<void> ActorGroupBase::whenSynced() { return impl->waits.wrap(impl->whenSynced()); }

kj::Array<kj::Own<const GroupMember>> ActorGroupBase::readyMembers() {
  return KJ_MAP(m, impl->ready) { return kj::Own<const GroupMember>(kj::addRef(*m)); };
}

kj::Own<const GroupMember> ActorGroupBase::readyMember(size_t index) {
  KJ_REQUIRE(index < impl->ready.size(), "no READY member at that index", index,
             impl->ready.size());
  return kj::addRef(*impl->ready[index]);
}

kj::StringPtr ActorGroupBase::jobId() const { return impl->jobId; }
bool ActorGroupBase::callsSameHost() const { return impl->options.sameHost; }
kj::StringPtr ActorGroupBase::actorName() const { return impl->actor; }
EventLoop& ActorGroupBase::loop() { return impl->loop; }

}  // namespace troupe
