#include "troupe/pool/actor_pool.h"

#include <kj/debug.h>

#include "troupe/base/errors.h"
#include "troupe/net/same_host.h"
#include "troupe/pool/detail/broadcast_state.h"
#include "troupe/pool/detail/pool_call.h"
#include "troupe/pool/detail/pool_core.h"

namespace troupe {

PoolCounters::Member& PoolCounters::member(kj::StringPtr name) {
  auto it = members.find(std::string_view(name.begin(), name.size()));
  if (it != members.end()) return it->second;
  if (members.size() >= MAX_MEMBERS) return members["other"];
  return members[name.cStr()];
}

namespace {

// Counts a finished call() or broadcast member: `failure` null for a success.
void countOutcome(CallOutcomes& outcomes, kj::Maybe<const kj::Exception&> failure) {
  KJ_IF_MAYBE(e, failure) {
    outcomes.countError(errorCode(*e));
  } else {
    ++outcomes.ok;
  }
}

}  // namespace

ActorPoolBase::Impl::Impl(ActorGroupBase& group, ActorPoolOptions&& options)
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

kj::Promise<void> ActorPoolBase::Impl::whenIdle() {
  if (inFlight == 0) return kj::READY_NOW;
  return idle.next().then([this]() { return whenIdle(); });
}

kj::Exception ActorPoolBase::Impl::drainingError() const {
  return makeError(ErrorCode::DRAINING,
                   kj::str("the pool over ", group.jobId(), "/", group.actorName(),
                           "- is draining; it takes no new calls"));
}

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

kj::Promise<CallResult<kj::Own<AnyResponse>>> ActorPoolBase::callWith(Attempt attempt,
                                                                      const CallOptions& options,
                                                                      bool nameMember) {
  using Result = CallResult<kj::Own<AnyResponse>>;
  auto& pool = *impl;
  if (pool.draining) return Result{{}, nullptr, pool.drainingError()};
  auto call = pool_detail::PoolCall::run(pool, options, kj::mv(attempt), nameMember)
                  .then([&pool](Result&& r) {
                    if (pool.options.metrics) {
                      countOutcome(pool.counters.calls, r.error);
                      pool.counters.latency.record(r.latency);
                    }
                    return kj::mv(r);
                  });
  // Cancelled with the pool: its error becomes the result.
  return pool.track(kj::mv(call)).catch_([](kj::Exception&& e) {
    return Result{{}, nullptr, kj::mv(e)};
  });
}

BroadcastFutureBase ActorPoolBase::broadcastWith(Attempt attempt, const CallOptions& options) {
  auto& pool = *impl;
  auto members = pool.group.readyMembers();
  // Each member's call may send it again (sendOnce()), until the last of them ends.
  struct SharedAttempt final : public kj::Refcounted {
    explicit SharedAttempt(Attempt attempt) : attempt(kj::mv(attempt)) {}
    Attempt attempt;
  };
  auto shared = kj::refcounted<SharedAttempt>(kj::mv(attempt));
  auto state = kj::refcounted<pool_detail::BroadcastState>(
      pool.group.loop(), KJ_MAP(m, members) { return m->endpoint; });
  auto& s = *state;
  ++pool.counters.broadcasts;
  // Each member call settles its slot; the state holds the calls, so it outlives them.
  s.calls = KJ_MAP(m, members)->kj::Promise<void> {
    size_t i = &m - members.begin();
    if (pool.draining) {
      s.failed(i, pool.drainingError());
      return kj::READY_NOW;
    }
    kj::Maybe<PoolCounters::Member&> counted;
    if (pool.options.metrics) {
      counted = pool.counters.member(m->endpoint.name);
      ++KJ_ASSERT_NONNULL(counted).attempts;
    }
    ActorRefBase ref = m->ref;
    auto sent = ref.sendCall<kj::Own<AnyResponse>>(
        options, [shared = kj::addRef(*shared)](capnp::Capability::Client c) mutable {
          return shared->attempt(kj::mv(c));
        });
    auto call = ref.finishCall(kj::mv(sent), options)
                    .then(
                        [&pool, &s, i, counted](kj::Own<AnyResponse>&& response) {
                          KJ_IF_MAYBE(c, counted) {
                            c->latency.record(s.elapsed());
                            countOutcome(pool.counters.broadcastMembers, nullptr);
                          }
                          s.succeeded(i, kj::mv(response));
                        },
                        [&pool, &s, i, counted](kj::Exception&& e) {
                          KJ_IF_MAYBE(c, counted) {
                            ++c->failures;
                            c->latency.record(s.elapsed());
                            countOutcome(pool.counters.broadcastMembers, e);
                          }
                          s.failed(i, kj::mv(e));
                        });
    // A call the pool cancelled (it was destroyed) fails its member.
    return pool.track(kj::mv(call))
        .catch_([&s, i](kj::Exception&& e) {
          if (!s.isDone(i)) s.failed(i, kj::mv(e));
        })
        .eagerlyEvaluate(nullptr);
  };
  return BroadcastFutureBase(kj::mv(state));
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
  bool sameHost = group().callsSameHost();
  auto targets = KJ_MAP(m, members) {
    auto& e = m->endpoint;
    if (!sameHost) return BlobTarget{e.name, e.address, {}, {}};
    return BlobTarget{e.name, e.address, metadataOf(e, SAME_HOST_SOCKET_KEY),
                      metadataOf(e, SAME_HOST_ID_KEY)};
  };
  return sendBlob(group().loop(), targets, name, version, kj::mv(bytes), kj::mv(options));
}

}  // namespace troupe
