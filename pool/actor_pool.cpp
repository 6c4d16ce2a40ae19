#include "troupe/pool/actor_pool.h"

#include <map>
#include <string>

#include <kj/debug.h>
#include <spdlog/spdlog.h>

#include "troupe/base/backoff.h"
#include "troupe/base/change_signal.h"
#include "troupe/base/errors.h"
#include "troupe/pool/detail/member_health.h"

namespace troupe {

namespace {

class PoolCall;

}  // namespace

// What a pool counts for its metrics. Loop thread only.
struct PoolCounters {
  struct Member {
    uint64_t attempts = 0;
    uint64_t failures = 0;
    LatencyHistogram latency;  // of every attempt, answered or failed
  };
  // Members beyond this many are counted together under member="other", so a group whose
  // members come and go for weeks keeps a bounded number of series.
  static constexpr size_t MAX_MEMBERS = 1024;

  CallOutcomes calls;        // finished call()s, by outcome
  LatencyHistogram latency;  // of call()s, every attempt and backoff included
  uint64_t retries = 0;      // attempts after a call's first
  uint64_t failovers = 0;    // retries that went to another member than the attempt before
  uint64_t broadcasts = 0;
  CallOutcomes broadcastMembers;  // the results of broadcast members
  std::map<std::string, Member, std::less<>> members;

  Member& member(kj::StringPtr name) {
    auto it = members.find(std::string_view(name.begin(), name.size()));
    if (it != members.end()) return it->second;
    if (members.size() >= MAX_MEMBERS) return members["other"];
    return members[name.cStr()];
  }
};

struct ActorPoolBase::Impl final : public MetricsSource {
  Impl(ActorGroupBase& group, ActorPoolOptions&& options)
      : group(group),
        options(kj::mv(options)),
        backoff(this->options.initialBackoff, this->options.maxBackoff,
                "ActorPoolOptions' initialBackoff and maxBackoff"),
        health(group.loop(), this->options) {
    auto& o = this->options;
    constexpr auto zero = 0 * kj::SECONDS;
    if (o.probeAfter > zero && o.probeTimeout <= zero) {
      throwError(ErrorCode::INVALID_ARGUMENT,
                 "ActorPoolOptions::probeTimeout must be positive when probeAfter is");
    }
    if (o.ejectionTime <= zero || o.maxEjectionTime < o.ejectionTime) {
      throwError(ErrorCode::INVALID_ARGUMENT,
                 "ActorPoolOptions' ejectionTime must be positive and at most maxEjectionTime");
    }
    metricsRegistration = group.loop().metrics().add(*this);
  }

  void collectMetrics(MetricsSnapshot& out) const override;

  // Counts a finished call() or broadcast member: `failure` null for a success.
  static void countOutcome(CallOutcomes& outcomes, kj::Maybe<const kj::Exception&> failure) {
    KJ_IF_MAYBE(e, failure) {
      outcomes.countError(errorCode(*e));
    } else {
      ++outcomes.ok;
    }
  }

  // `promise`, counted in flight until it settles or is dropped, and cancelled with the pool.
  kj::Promise<void> track(kj::Promise<void> promise) {
    ++inFlight;
    auto counted = promise.attach(kj::defer([this]() {
      if (--inFlight == 0) idle.notify();
    }));
    return canceler.wrap(kj::mv(counted));
  }

  kj::Promise<void> whenIdle() {
    if (inFlight == 0) return kj::READY_NOW;
    return idle.next().then([this]() { return whenIdle(); });
  }

  kj::Exception drainingError() const {
    return makeError(ErrorCode::DRAINING,
                     kj::str("the pool over ", group.jobId(), "/", group.actorName(),
                             "- is draining; it takes no new calls"));
  }

  // The error a call gets when its deadline passes: NO_ENDPOINTS when no member was ever ready
  // for it (it never ran), else DEADLINE_EXCEEDED.
  kj::Exception deadlineError(kj::Duration deadline, bool attempted) const {
    if (!attempted) {
      return makeError(ErrorCode::NO_ENDPOINTS,
                       kj::str("no member of ", group.jobId(), "/", group.actorName(),
                               "- was ready within ", deadline / kj::MILLISECONDS,
                               " ms; the call was not sent"));
    }
    return makeError(ErrorCode::DEADLINE_EXCEEDED,
                     kj::str("call to ", group.jobId(), "/", group.actorName(),
                             "-* did not finish within ", deadline / kj::MILLISECONDS,
                             " ms; it may have run"));
  }

  kj::Promise<void> next(kj::Own<PoolCall> call);
  // Tells `health` what the failure of an attempt on `member` says about the member.
  void noteFailure(const GroupMember& member, const kj::Exception& e);

  ActorGroupBase& group;
  const ActorPoolOptions options;
  const Backoff backoff;
  pool_detail::MemberHealth health;
  size_t nextIndex = 0;
  std::map<std::string, uint32_t, std::less<>> outstanding;
  size_t inFlight = 0;
  ChangeSignal idle;  // notified when inFlight drops to 0
  bool draining = false;
  kj::Maybe<kj::ForkedPromise<void>> drained;
  PoolCounters counters;
  MetricsSet::Registration metricsRegistration;
  kj::Canceler canceler;  // every call and broadcast member call in flight
};

void ActorPoolBase::Impl::collectMetrics(MetricsSnapshot& out) const {
  MetricLabels labels = {{"job", group.jobId().cStr()}, {"actor", group.actorName().cStr()}};
  auto withLabel = [&](const char* key, kj::StringPtr value) {
    auto l = labels;
    l.emplace_back(key, value.cStr());
    return l;
  };
  auto& c = counters;
  auto outcomes = [&](kj::StringPtr name, kj::StringPtr help, const CallOutcomes& o) {
    out.add(name, help, MetricType::COUNTER, withLabel("code", "ok"), static_cast<double>(o.ok));
    for (size_t i = 0; i < CallOutcomes::CODES; ++i) {
      if (o.errors[i] == 0) continue;
      out.add(name, help, MetricType::COUNTER,
              withLabel("code", errorCodeName(static_cast<ErrorCode>(i))),
              static_cast<double>(o.errors[i]));
    }
  };
  outcomes("troupe_client_calls_total",
           "Pool calls finished, by outcome: ok or the error code the caller got.", c.calls);
  out.addHistogram("troupe_client_call_duration_seconds",
                   "Pool call latency as the caller sees it, retries and backoff included.", labels,
                   c.latency);
  out.add("troupe_client_calls_in_flight", "Pool calls and broadcast member calls not finished.",
          MetricType::GAUGE, labels, static_cast<double>(inFlight));
  out.add("troupe_client_retries_total", "Attempts after a call's first.", MetricType::COUNTER,
          labels, static_cast<double>(c.retries));
  out.add("troupe_client_failovers_total",
          "Retries sent to another member than the attempt before.", MetricType::COUNTER, labels,
          static_cast<double>(c.failovers));
  out.add("troupe_client_may_have_run_total",
          "Calls given up because they may have run and were not marked idempotent.",
          MetricType::COUNTER, labels, static_cast<double>(c.calls.error(ErrorCode::MAY_HAVE_RUN)));
  out.add("troupe_client_broadcasts_total", "Broadcasts started.", MetricType::COUNTER, labels,
          static_cast<double>(c.broadcasts));
  outcomes("troupe_client_broadcast_members_total",
           "Broadcast member results, by outcome: ok or the member's error code.",
           c.broadcastMembers);
  for (auto& [name, m] : c.members) {
    auto l = withLabel("member", name);
    out.add("troupe_client_attempts_total", "Attempts sent to each member.", MetricType::COUNTER, l,
            static_cast<double>(m.attempts));
    out.add("troupe_client_attempt_failures_total",
            "Attempts on each member that failed (the actor's own errors included).",
            MetricType::COUNTER, l, static_cast<double>(m.failures));
    out.addHistogram("troupe_client_attempt_duration_seconds",
                     "Latency of each member's attempts, as this pool saw it.", l, m.latency);
  }
}

namespace {

// Counts one attempt in flight to `member` for LEAST_OUTSTANDING, until dropped (whether the
// attempt finished, failed or was cancelled).
class Outstanding {
public:
  Outstanding(ActorPoolBase::Impl& pool, const std::string& member) : pool(pool) {
    it = pool.outstanding.emplace(member, 0).first;
    ++it->second;
  }
  ~Outstanding() noexcept(false) {
    if (--it->second == 0) pool.outstanding.erase(it);
  }
  KJ_DISALLOW_COPY(Outstanding);

private:
  ActorPoolBase::Impl& pool;
  std::map<std::string, uint32_t, std::less<>>::iterator it;
};

// The retry decisions of one call(). Loop thread only.
class PoolCall {
public:
  using Attempt = kj::Function<kj::Promise<void>(capnp::Capability::Client)>;

  // `attempted` is set once an attempt reached (or tried to reach) a member; the deadline reads
  // it, so it outlives the call.
  PoolCall(ActorPoolBase::Impl& pool, const CallOptions& options, Attempt attempt, bool& attempted,
           std::string* reportMember)
      : pool(pool),
        attempt(kj::mv(attempt)),
        attempted(attempted),
        reportMember(reportMember),
        idempotent(options.idempotent),
        deadline(options.deadline.orDefault(pool.options.defaultDeadline)) {}
  KJ_DISALLOW_COPY(PoolCall);

  // The member for the next attempt; null when no member is READY.
  kj::Maybe<kj::Own<const GroupMember>> pick();

  // The next of the `n` READY members (by the pool's balancing) that is `eligible`; null if none.
  kj::Maybe<kj::Own<const GroupMember>> choose(
      size_t n, kj::FunctionParam<bool(const GroupMember&)> eligible);

  // After the attempt on `member` failed with `e`: resolves when the call should be tried
  // again, or rejects with the error the caller gets (see ActorPool::call).
  kj::Promise<void> afterFailure(kj::Exception&& e, const Endpoint& member);

  // No member was READY: resolves when the group changed (rejects with JOB_ENDED when the job
  // has ended). Waiting for a member does not count against maxAttempts; the deadline bounds it.
  kj::Promise<void> afterNoMember();

  ActorPoolBase::Impl& pool;
  Attempt attempt;
  bool& attempted;
  std::string* const reportMember;  // gets each attempt's member name, when not null
  const bool idempotent;
  const kj::Duration deadline;

private:
  kj::Promise<void> retryLater(kj::Exception&& e, bool immediately);
  bool tried(const GroupMember& m) const { return failedOn.count(m.endpoint.name) > 0; }

public:
  uint32_t attempts = 0;
  std::string lastMember;  // of the latest attempt

private:
  std::map<std::string, uint32_t> failedOn;  // members this call failed on
};

kj::Maybe<kj::Own<const GroupMember>> PoolCall::pick() {
  auto& group = pool.group;
  size_t n = group.readyCount();
  if (n == 0) return nullptr;
  // Prefer members this call has not failed on, and among those the ones not ejected; when
  // every such member is ejected, use them anyway: a pool must not refuse a call it could send.
  bool anyFresh = failedOn.empty();
  for (size_t k = 0; k < n && !anyFresh; ++k) anyFresh = !tried(*group.readyMember(k));
  kj::Maybe<kj::Own<const GroupMember>> chosen;
  for (bool healthy : {true, false}) {
    chosen = choose(n, [&](const GroupMember& m) {
      return !(anyFresh && tried(m)) && (!healthy || pool.health.available(m));
    });
    if (chosen != nullptr) break;
  }
  ++attempts;
  attempted = true;
  return chosen;
}

kj::Maybe<kj::Own<const GroupMember>> PoolCall::choose(
    size_t n, kj::FunctionParam<bool(const GroupMember&)> eligible) {
  auto& group = pool.group;
  kj::Maybe<kj::Own<const GroupMember>> chosen;
  if (pool.options.balancing == Balancing::LEAST_OUTSTANDING) {
    uint32_t fewest = 0;
    for (size_t k = 0; k < n; ++k) {
      auto m = group.readyMember((pool.nextIndex + k) % n);
      if (!eligible(*m)) continue;
      auto it = pool.outstanding.find(m->endpoint.name);
      uint32_t busy = it == pool.outstanding.end() ? 0 : it->second;
      if (chosen == nullptr || busy < fewest) {
        chosen = kj::mv(m);
        fewest = busy;
      }
    }
    ++pool.nextIndex;
    return chosen;
  }
  for (size_t k = 0; k < n; ++k) {
    auto m = group.readyMember(pool.nextIndex++ % n);
    if (eligible(*m)) return kj::mv(m);
  }
  return nullptr;
}

kj::Promise<void> PoolCall::afterFailure(kj::Exception&& e, const Endpoint& member) {
  auto code = errorCode(e);
  if (raisedByActor(e) || !mayRetry(code)) return kj::mv(e);
  bool retry = callNeverRan(code) || idempotent;
  if (!retry) {
    return makeError(ErrorCode::MAY_HAVE_RUN,
                     kj::str("the call to ", member.name, " (", member.address,
                             ") failed after it may have reached the actor, and it is not marked "
                             "idempotent, so it was not sent again: ",
                             e.getDescription()));
  }
  ++failedOn[member.name];
  // Another member that this call has not failed on: go there at once.
  bool another = false;
  auto& group = pool.group;
  for (size_t k = 0, n = group.readyCount(); k < n && !another; ++k) {
    another = !tried(*group.readyMember(k));
  }
  return retryLater(kj::mv(e), another);
}

kj::Promise<void> PoolCall::afterNoMember() {
  KJ_IF_MAYBE(job, pool.group.jobEnded()) {
    return makeError(ErrorCode::JOB_ENDED,
                     kj::str("job '", job->jobId, "' has ended (", job->reason, ")"));
  }
  return pool.group.whenChanged();
}

kj::Promise<void> PoolCall::retryLater(kj::Exception&& e, bool immediately) {
  if (attempts >= pool.options.maxAttempts) {
    return makeError(errorCode(e), kj::str("gave up after ", attempts,
                                           " attempts; the last: ", e.getDescription()));
  }
  if (immediately) return kj::READY_NOW;
  auto& loop = pool.group.loop();
  auto wait = pool.backoff.delay(attempts - 1, loop.random());
  loop.logger()->debug("retrying a call to {}/{} in {} ms: {}", pool.group.jobId().cStr(),
                       pool.group.actorName().cStr(), wait / kj::MILLISECONDS,
                       e.getDescription().cStr());
  return loop.timer().afterDelay(wait);
}

}  // namespace

kj::Promise<void> ActorPoolBase::Impl::next(kj::Own<PoolCall> call) {
  KJ_IF_MAYBE(picked, call->pick()) {
    auto member = kj::mv(*picked);
    // The member's counters, and when the attempt started; null when the pool counts nothing.
    kj::Maybe<PoolCounters::Member&> counted;
    kj::TimePoint startedAt = kj::origin<kj::TimePoint>();
    if (options.metrics) {
      auto& name = member->endpoint.name;
      counted = counters.member(name);
      ++KJ_ASSERT_NONNULL(counted).attempts;
      if (call->attempts > 1) {
        ++counters.retries;
        if (call->lastMember != name) ++counters.failovers;
      }
      call->lastMember = name;
      startedAt = group.loop().timer().now();
    }
    if (call->reportMember != nullptr) *call->reportMember = member->endpoint.name;
    ActorRefBase ref = member->ref;
    auto& attempt = call->attempt;
    bool idempotent = call->idempotent;
    auto sent = kj::evalNow([&]() { return attempt(ref.capability()); });
    // `m` lives in the catch_ below, which outlasts this step.
    auto answered = ref.finishCall(kj::mv(sent), CallOptions{.idempotent = idempotent})
                        .then([this, &m = *member, counted, startedAt]() {
                          KJ_IF_MAYBE(c, counted) {
                            c->latency.record(group.loop().timer().now() - startedAt);
                          }
                          health.succeeded(m);
                        });
    if (health.watches(idempotent)) {
      answered = answered.exclusiveJoin(health.watch(*member, idempotent));
    }
    return answered.attach(kj::heap<Outstanding>(*this, member->endpoint.name))
        .catch_([this, call = kj::mv(call), member = kj::mv(member), counted,
                 startedAt](kj::Exception&& e) mutable -> kj::Promise<void> {
          KJ_IF_MAYBE(c, counted) {
            ++c->failures;
            c->latency.record(group.loop().timer().now() - startedAt);
          }
          noteFailure(*member, e);
          auto& c = *call;
          return c.afterFailure(kj::mv(e), member->endpoint)
              .then([this, call = kj::mv(call)]() mutable { return next(kj::mv(call)); });
        });
  }
  auto& c = *call;
  return c.afterNoMember().then(
      [this, call = kj::mv(call)]() mutable { return next(kj::mv(call)); });
}

void ActorPoolBase::Impl::noteFailure(const GroupMember& member, const kj::Exception& e) {
  // An error its actor raised shows the member works; the connection's and troupe's own
  // failures of the member count against it. Errors that send calls elsewhere because the
  // member is leaving (DRAINING, ACTOR_NOT_FOUND) do not: the group will drop it.
  if (raisedByActor(e)) return health.succeeded(member);
  switch (errorCode(e)) {
    case ErrorCode::DISCONNECTED:
    case ErrorCode::UNREACHABLE:
    case ErrorCode::OVERLOADED:
    case ErrorCode::DEADLINE_EXCEEDED:
    case ErrorCode::QUEUE_FULL:
      health.failed(member, e);
      break;
    default:
      break;
  }
}

// ------------------------------------------------------------------------------------------------

ActorPoolBase::ActorPoolBase(ActorGroupBase& group, ActorPoolOptions options)
    : impl(kj::heap<Impl>(group, kj::mv(options))) {}

ActorPoolBase::~ActorPoolBase() noexcept(false) {
  // The calls refer to the pool: end them while it is whole.
  impl->canceler.cancel(
      makeError(ErrorCode::FAILED,
                kj::str("the pool over ", impl->group.jobId(), "/", impl->group.actorName(),
                        "- was destroyed before the call finished; it may have run")));
}

ActorGroupBase& ActorPoolBase::group() { return impl->group; }
const ActorPoolOptions& ActorPoolBase::options() const { return impl->options; }
size_t ActorPoolBase::callsInFlight() const { return impl->inFlight; }

bool ActorPoolBase::ejected(kj::StringPtr member) const { return impl->health.ejected(member); }

uint32_t ActorPoolBase::outstanding(kj::StringPtr member) const {
  auto it = impl->outstanding.find(std::string_view(member.begin(), member.size()));
  return it == impl->outstanding.end() ? 0 : it->second;
}

kj::Promise<void> ActorPoolBase::callWith(Attempt attempt, const CallOptions& options,
                                          std::string* member) {
  if (impl->draining) return impl->drainingError();
  // Attached last, so it outlives both the attempts and the deadline, which read it.
  auto attempted = kj::heap<bool>(false);
  auto call = kj::heap<PoolCall>(*impl, options, kj::mv(attempt), *attempted, member);
  auto deadline = call->deadline;
  auto expired = impl->group.loop().timer().afterDelay(deadline).then(
      [this, deadline, &attempted = *attempted]() -> kj::Promise<void> {
        return impl->deadlineError(deadline, attempted);
      });
  auto attempts = impl->next(kj::mv(call));
  if (!impl->options.metrics) {
    return impl->track(attempts.exclusiveJoin(kj::mv(expired)).attach(kj::mv(attempted)));
  }
  auto& i = *impl;
  auto startedAt = i.group.loop().timer().now();
  auto counted = attempts.exclusiveJoin(kj::mv(expired))
                     .then(
                         [&i, startedAt]() {
                           Impl::countOutcome(i.counters.calls, nullptr);
                           i.counters.latency.record(i.group.loop().timer().now() - startedAt);
                         },
                         [&i, startedAt](kj::Exception&& e) {
                           Impl::countOutcome(i.counters.calls, e);
                           i.counters.latency.record(i.group.loop().timer().now() - startedAt);
                           kj::throwFatalException(kj::mv(e));
                         });
  return impl->track(counted.attach(kj::mv(attempted)));
}

kj::Array<kj::Promise<void>> ActorPoolBase::callEach(
    kj::ArrayPtr<const kj::Own<const GroupMember>> members, MemberCall call) {
  ++impl->counters.broadcasts;
  auto& pool = *impl;
  return KJ_MAP(m, members) {
    if (pool.draining) return kj::Promise<void>(pool.drainingError());
    size_t i = &m - members.begin();
    if (!pool.options.metrics) return pool.track(kj::evalNow([&]() { return call(i, m->ref); }));
    auto& counted = pool.counters.member(m->endpoint.name);
    ++counted.attempts;
    auto startedAt = pool.group.loop().timer().now();
    auto done = kj::evalNow([&]() { return call(i, m->ref); });
    return pool.track(done.then(
        [&pool, &counted, startedAt]() {
          counted.latency.record(pool.group.loop().timer().now() - startedAt);
          Impl::countOutcome(pool.counters.broadcastMembers, nullptr);
        },
        [&pool, &counted, startedAt](kj::Exception&& e) {
          ++counted.failures;
          counted.latency.record(pool.group.loop().timer().now() - startedAt);
          Impl::countOutcome(pool.counters.broadcastMembers, e);
          kj::throwFatalException(kj::mv(e));
        }));
  };
}

MetricsSnapshot ActorPoolBase::metrics() const {
  MetricsSnapshot out;
  impl->collectMetrics(out);
  return out;
}

kj::Promise<void> ActorPoolBase::drain() {
  KJ_IF_MAYBE(d, impl->drained) {
    return d->addBranch();
  }
  impl->draining = true;
  // Cancelled with the pool's calls: whenIdle() refers to the pool.
  auto& fork = impl->drained.emplace(impl->canceler.wrap(impl->whenIdle()).fork());
  return fork.addBranch();
}

BlobTransfer ActorPoolBase::broadcastBlob(kj::StringPtr name, uint64_t version,
                                          kj::Array<const kj::byte> bytes,
                                          BlobSendOptions options) {
  auto members = group().readyMembers();
  if (members.size() == 0) {
    throwError(ErrorCode::NO_ENDPOINTS, kj::str("blob '", name, "': no member of ", group().jobId(),
                                                "/", group().actorName(), "-* is READY"));
  }
  auto targets = KJ_MAP(m, members) { return BlobTarget{m->endpoint.name, m->endpoint.address}; };
  return sendBlob(group().loop(), targets, name, version, kj::mv(bytes), kj::mv(options));
}

}  // namespace troupe
