#include "troupe/pool/detail/member_health.h"

#include <algorithm>

#include <kj/debug.h>
#include <spdlog/spdlog.h>

#include "troupe/base/backoff.h"
#include "troupe/base/errors.h"

namespace troupe::pool_detail {

struct MemberHealth::Record {
  uint64_t incarnation = 0;
  uint32_t failures = 0;                  // attempts failed in a row
  uint32_t ejections = 0;                 // ejections in a row (forgotten after maxEjectionTime in)
  kj::Maybe<kj::TimePoint> ejectedUntil;  // while ejected, and while the readmission ping runs
  kj::Maybe<kj::TimePoint> lastEjected;
  bool pinging = false;
  kj::Maybe<kj::ForkedPromise<bool>> ping;  // the last ping; in flight while `pinging`
  bool readmitting = false;
  kj::Maybe<kj::Promise<void>> readmission;  // the ping that may end the ejection
};

namespace {

uint64_t millis(kj::Duration d) { return d / kj::MILLISECONDS; }

// A reference of our own to `member`, for a continuation. Members are immutable once made; only
// their reference count changes.
kj::Own<const GroupMember> share(const GroupMember& member) {
  return kj::addRef(const_cast<GroupMember&>(member));
}

}  // namespace

MemberHealth::MemberHealth(EventLoop& loop, const ActorPoolOptions& options)
    : loop(loop),
      options(options),
      probes(kj::heap<kj::TaskSet>(static_cast<kj::TaskSet::ErrorHandler&>(*this))) {}

MemberHealth::~MemberHealth() noexcept(false) {
  // The probes refer to the records and to this; the attempts watched are gone (the pool ended
  // them first).
  probes = nullptr;
  sweeping = nullptr;
}

MemberHealth::Record& MemberHealth::recordFor(const GroupMember& member) {
  auto& endpoint = member.endpoint;
  auto it = records.find(endpoint.name);
  if (it == records.end()) {
    it = records.emplace(endpoint.name, Record{}).first;
    it->second.incarnation = endpoint.incarnation;
  } else if (it->second.incarnation != endpoint.incarnation) {
    // A new process under the name: start afresh.
    it->second = Record{};
    it->second.incarnation = endpoint.incarnation;
  }
  return it->second;
}

bool MemberHealth::available(const GroupMember& member) {
  auto it = records.find(member.endpoint.name);
  if (it == records.end()) return true;
  auto& r = it->second;
  if (r.incarnation != member.endpoint.incarnation) return true;  // recordFor() will reset it
  KJ_IF_MAYBE(until, r.ejectedUntil) {
    if (loop.timer().now() < *until || r.readmitting) return false;
    // The period is over: the member comes back once it answers a ping.
    r.readmitting = true;
    std::string name = member.endpoint.name;
    uint64_t incarnation = member.endpoint.incarnation;
    r.readmission = probe(member)
                        .then([this, name = kj::mv(name), incarnation](bool answered) {
                          auto found = records.find(name);
                          if (found == records.end()) return;
                          auto& record = found->second;
                          if (record.incarnation != incarnation) return;
                          record.readmitting = false;
                          // Unanswered, probe() ejected it again, for longer.
                          if (!answered) return;
                          record.ejectedUntil = nullptr;
                          record.failures = 0;
                          loop.logger()->info("{} answered a ping; it takes calls again", name);
                        })
                        .eagerlyEvaluate(nullptr);
    return false;
  }
  return true;
}

bool MemberHealth::ejected(kj::StringPtr name) const {
  auto it = records.find(std::string_view(name.begin(), name.size()));
  if (it == records.end()) return false;
  KJ_IF_MAYBE(until, it->second.ejectedUntil) {
    return loop.timer().now() < *until || it->second.readmitting;
  }
  return false;
}

void MemberHealth::succeeded(const GroupMember& member) {
  auto it = records.find(member.endpoint.name);
  if (it != records.end() && it->second.incarnation == member.endpoint.incarnation) {
    it->second.failures = 0;
  }
}

void MemberHealth::failed(const GroupMember& member, const kj::Exception& why) {
  auto& r = recordFor(member);
  ++r.failures;
  if (options.ejectAfterFailures > 0 && r.failures >= options.ejectAfterFailures) {
    eject(r, member,
          kj::str(r.failures, " attempts in a row failed; the last: ", errorMessage(why)));
  }
}

void MemberHealth::eject(Record& r, const GroupMember& member, kj::StringPtr why) {
  auto now = loop.timer().now();
  KJ_IF_MAYBE(until, r.ejectedUntil) {
    if (now < *until) return;  // ejected already
  }
  KJ_IF_MAYBE(last, r.lastEjected) {
    if (now - *last > options.maxEjectionTime * 2) r.ejections = 0;
  }
  // Doubled for each ejection in a row (the pool checked the times when it was made).
  auto period = Backoff(options.ejectionTime, options.maxEjectionTime).ceiling(r.ejections);
  r.ejectedUntil = now + period;
  r.lastEjected = now;
  ++r.ejections;
  r.failures = 0;
  loop.logger()->warn("{} ({}) gets no calls from this pool for {} ms: {}", member.endpoint.name,
                      member.endpoint.address, millis(period), why.cStr());
}

kj::Promise<bool> MemberHealth::probe(const GroupMember& member) {
  auto& r = recordFor(member);
  if (!r.pinging) {
    KJ_IF_MAYBE(until, r.ejectedUntil) {
      // Known to be unresponsive, unless this is the ping that ends its ejection.
      if (loop.timer().now() < *until) return false;
    }
    r.pinging = true;
    ActorRefBase ref = member.ref;
    auto sentAt = loop.timer().now();
    auto answered = ref.ping(CallOptions{.deadline = options.probeTimeout})
                        .then([](uint64_t) { return kj::str(); },
                              [this, m = share(member), sentAt](kj::Exception&& e) {
                                if (busy(*m, sentAt, e)) return kj::str();
                                return kj::str(errorMessage(e));
                              });
    r.ping = answered
                 .then([this, m = share(member)](kj::String error) -> bool {
                   auto found = records.find(m->endpoint.name);
                   bool ok = error.size() == 0;
                   if (found == records.end()) return ok;
                   auto& record = found->second;
                   if (record.incarnation != m->endpoint.incarnation) return ok;
                   record.pinging = false;
                   if (!ok) {
                     eject(record, *m,
                           kj::str("it did not answer a ping within ", millis(options.probeTimeout),
                                   " ms: ", error));
                   }
                   return ok;
                 })
                 .fork();
  }
  return KJ_ASSERT_NONNULL(r.ping).addBranch();
}

bool MemberHealth::busy(const GroupMember& member, kj::TimePoint sentAt,
                        const kj::Exception& e) const {
  if (errorCode(e) != ErrorCode::DEADLINE_EXCEEDED) return false;
  // A ping waits behind a large message on the same connection, in either direction, and behind
  // what the kernels' buffers still held of one when it was sent. Bytes that moved since a probe
  // timeout before the ping show that the member is moving them, not stuck.
  auto& channel = member.ref.channel();
  KJ_IF_MAYBE(last, channel.largeMessageLastMoved()) {
    if (*last + options.probeTimeout < sentAt) return false;
    loop.logger()->debug(
        "{} did not answer a ping within {} ms while its connection moved a large message ({} "
        "bytes so far): busy, not unresponsive",
        member.endpoint.name, millis(options.probeTimeout), channel.largeMessageBytesMoved());
    return true;
  }
  return false;
}

bool MemberHealth::watches(bool idempotent) const {
  return options.probeAfter > 0 * kj::SECONDS ||
         (idempotent && options.attemptTimeout > 0 * kj::SECONDS);
}

kj::Exception MemberHealth::abandoned(const GroupMember& member, kj::StringPtr why) const {
  return makeError(ErrorCode::DEADLINE_EXCEEDED,
                   kj::str("the attempt on ", member.endpoint.name, " (", member.endpoint.address,
                           ") was given up: ", why, "; it may have run"));
}

// ------------------------------------------------------------------------------------------------
// Attempts waiting

MemberHealth::Waiter::Waiter(kj::PromiseFulfiller<void>& fulfiller, MemberHealth& health,
                             const GroupMember& member, bool idempotent)
    : health(health),
      member(share(member)),
      idempotent(idempotent),
      since(health.loop.timer().now()),
      checkFrom(since),
      fulfiller(fulfiller) {
  health.waiting.add(*this);
  auto& o = health.options;
  if (o.probeAfter > 0 * kj::SECONDS) health.sweepBy(since + o.probeAfter);
  if (idempotent && o.attemptTimeout > 0 * kj::SECONDS) health.sweepBy(since + o.attemptTimeout);
}

MemberHealth::Waiter::~Waiter() noexcept(false) {
  if (link.isLinked()) health.waiting.remove(*this);
}

void MemberHealth::Waiter::abandon(kj::Exception&& why) {
  if (link.isLinked()) health.waiting.remove(*this);
  fulfiller.reject(kj::mv(why));
}

void MemberHealth::sweepBy(kj::TimePoint due) {
  KJ_IF_MAYBE(at, sweepAt) {
    if (*at <= due) return;
  }
  sweepAt = due;
  sweeping = sweepsFrom(due).eagerlyEvaluate(nullptr);
}

kj::Promise<void> MemberHealth::sweepsFrom(kj::TimePoint due) {
  // Chained rather than re-armed from inside: a promise must not be replaced by its own
  // continuation.
  return loop.timer().atTime(due).then([this]() -> kj::Promise<void> {
    sweepAt = sweep();
    KJ_IF_MAYBE(next, sweepAt) {
      return sweepsFrom(*next);
    }
    return kj::READY_NOW;
  });
}

kj::Maybe<kj::TimePoint> MemberHealth::sweep() {
  auto now = loop.timer().now();
  auto& o = options;
  bool probing = o.probeAfter > 0 * kj::SECONDS;
  bool timing = o.attemptTimeout > 0 * kj::SECONDS;
  kj::Vector<Waiter*> late;     // past the attempt timeout
  kj::Vector<Waiter*> toProbe;  // one per member, due a probe
  kj::Maybe<kj::TimePoint> next;
  auto nextBy = [&](kj::TimePoint t) {
    KJ_IF_MAYBE(n, next) {
      if (*n <= t) return;
    }
    next = t;
  };
  for (auto& w : waiting) {
    if (w.idempotent && timing) {
      if (now >= w.since + o.attemptTimeout) {
        late.add(&w);
        continue;
      }
      nextBy(w.since + o.attemptTimeout);
    }
    if (!probing) continue;
    if (now >= w.checkFrom + o.probeAfter) {
      bool listed = false;
      for (auto* p : toProbe)
        listed = listed || p->member->endpoint.name == w.member->endpoint.name;
      if (!listed) toProbe.add(&w);
      // Until the probe answers, it says nothing new about this attempt.
      w.checkFrom = now + o.probeTimeout;
    }
    nextBy(w.checkFrom + o.probeAfter);
  }
  for (auto* w : late) {
    w->abandon(abandoned(*w->member, kj::str("no answer within the attempt timeout of ",
                                             millis(o.attemptTimeout), " ms")));
  }
  for (auto* w : toProbe) {
    probes->add(probe(*w->member).then([this, m = share(*w->member)](bool answered) {
      probed(*m, answered);
    }));
  }
  return next;
}

void MemberHealth::probed(const GroupMember& member, bool answered) {
  auto now = loop.timer().now();
  auto& e = member.endpoint;
  kj::Vector<Waiter*> giveUp;
  for (auto& w : waiting) {
    auto& we = w.member->endpoint;
    if (we.name != e.name || we.incarnation != e.incarnation) continue;
    if (answered || !w.idempotent) {
      // Alive (or it must wait anyway): probe again probeAfter from now while it waits.
      w.checkFrom = now;
      sweepBy(now + options.probeAfter);
    } else {
      giveUp.add(&w);
    }
  }
  for (auto* w : giveUp) {
    w->abandon(abandoned(*w->member, kj::str("it is unresponsive (no answer to a ping within ",
                                             millis(options.probeTimeout), " ms)")));
  }
}

void MemberHealth::taskFailed(kj::Exception&& exception) {
  loop.logger()->debug("probing a pool member: {}", exception.getDescription().cStr());
}

kj::Promise<void> MemberHealth::watch(const GroupMember& member, bool idempotent) {
  return kj::newAdaptedPromise<void, Waiter>(*this, member, idempotent);
}

}  // namespace troupe::pool_detail
