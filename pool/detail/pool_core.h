#pragma once
// What an ActorPool holds: its options, its members' health, its calls in flight and its
// counters. Shared by the pool (actor_pool.cpp) and its calls (pool_call.cpp).

#include <map>
#include <string>

#include <kj/async.h>

#include "troupe/base/backoff.h"
#include "troupe/base/change_signal.h"
#include "troupe/base/metrics.h"
#include "troupe/pool/actor_pool.h"
#include "troupe/pool/detail/member_health.h"

namespace troupe {

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

  Member& member(kj::StringPtr name);
};

// Loop thread only.
struct ActorPoolBase::Impl final : public MetricsSource {
  Impl(ActorGroupBase& group, ActorPoolOptions&& options);

  void collectMetrics(MetricsSnapshot& out) const override;

  // `promise`, counted in flight until it settles or is dropped, and cancelled with the pool.
  template <typename T>
  kj::Promise<T> track(kj::Promise<T> promise) {
    ++inFlight;
    return canceler.wrap(promise.attach(kj::defer([this]() {
      if (--inFlight == 0) idle.notify();
    })));
  }
  // Resolves once no call is in flight.
  kj::Promise<void> whenIdle();
  kj::Exception drainingError() const;

  ActorGroupBase& group;
  const ActorPoolOptions options;
  const Backoff backoff;
  pool_detail::MemberHealth health;
  size_t nextIndex = 0;  // where the next pick starts among the READY members
  std::map<std::string, uint32_t, std::less<>> outstanding;  // attempts in flight per member
  size_t inFlight = 0;
  ChangeSignal idle;  // notified when inFlight drops to 0
  bool draining = false;
  kj::Maybe<kj::ForkedPromise<void>> drained;
  PoolCounters counters;
  MetricsSet::Registration metricsRegistration;
  kj::Canceler canceler;  // every call and broadcast member call in flight
};

}  // namespace troupe
