#include "troupe/pool/detail/pool_call.h"

#include <kj/debug.h>
#include <spdlog/spdlog.h>

#include "troupe/base/errors.h"
#include "troupe/pool/detail/pool_core.h"

namespace troupe::pool_detail {

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

// Tells `health` what an attempt on `member` that failed with `e` says about the member. An
// error its actor raised shows the member works; the connection's and troupe's own failures of
// the member count against it. Errors that send calls elsewhere because the member is leaving
// (DRAINING, ACTOR_NOT_FOUND) do not: the group will drop it.
void noteFailure(MemberHealth& health, const GroupMember& member, const kj::Exception& e) {
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

}  // namespace

AttemptEnd judge(const kj::Exception& e, bool idempotent) {
  if (raisedByActor(e)) return AttemptEnd::ACTOR_RAISED;
  auto code = errorCode(e);
  // The member's handle sent it again and could not learn its fate (ActorRefBase::sendOnce).
  if (code == ErrorCode::MAY_HAVE_RUN) return AttemptEnd::MAY_HAVE_RUN;
  if (!mayRetry(code)) return AttemptEnd::FAILED;
  if (callNeverRan(code) || idempotent) return AttemptEnd::FAILED_OVER;
  return AttemptEnd::MAY_HAVE_RUN;
}

kj::Promise<PoolCall::Result> PoolCall::run(ActorPoolBase::Impl& pool, const CallOptions& options,
                                            ActorPoolBase::Attempt attempt, bool nameMember) {
  auto call = kj::heap<PoolCall>(pool, options, kj::mv(attempt), nameMember);
  auto& c = *call;
  auto expiry = pool.group.loop().timer().afterDelay(c.deadline).then([&c]() {
    return c.expired();
  });
  // Every state resolves with a Result; an error none of them expected (a bug) still ends the
  // call with its error rather than losing it.
  return c.picking()
      .exclusiveJoin(kj::mv(expiry))
      .catch_([&c](kj::Exception&& e) { return c.done(nullptr, kj::mv(e)); })
      .attach(kj::mv(call));
}

PoolCall::PoolCall(ActorPoolBase::Impl& pool, const CallOptions& options,
                   ActorPoolBase::Attempt attempt, bool nameMember)
    : pool(pool),
      attempt(kj::mv(attempt)),
      idempotent(options.idempotent),
      nameMember(nameMember),
      deadline(options.deadline.orDefault(pool.options.defaultDeadline)),
      start(pool.group.loop().timer().now()) {}

kj::Promise<PoolCall::Result> PoolCall::picking() {
  KJ_IF_MAYBE(member, pick()) {
    auto counted = counting(**member);
    // The call holds the member of its latest attempt until the next attempt, or its end.
    last = kj::mv(*member);
    return attempting(*last, counted).then([this](Attempted&& a) { return ended(kj::mv(a)); });
  }
  // No member is READY: wait for the group to change. Waiting does not count against
  // maxAttempts; the deadline bounds it.
  KJ_IF_MAYBE(job, pool.group.jobEnded()) {
    return done(nullptr,
                makeError(ErrorCode::JOB_ENDED,
                          kj::str("job '", job->jobId, "' has ended (", job->reason, ")")));
  }
  return pool.group.whenChanged().then([this]() { return picking(); });
}

kj::Promise<Attempted> PoolCall::attempting(const GroupMember& member,
                                            kj::Maybe<PoolCounters::Member&> counted) {
  // When the attempt started, for its member's latency, when the pool counts.
  auto startedAt = counted == nullptr ? start : pool.group.loop().timer().now();
  ActorRefBase ref = member.ref;
  CallOptions options{.idempotent = idempotent};
  // One that is not idempotent is sent again to this member, with the same id, while its server
  // lives (ActorRefBase::sendOnce()); this call outlives it.
  auto sent = ref.sendCall<kj::Own<AnyResponse>>(options, [this](capnp::Capability::Client c) {
    return attempt(kj::mv(c));
  });
  auto answer = ref.finishCall(kj::mv(sent), options);
  if (pool.health.watches(idempotent)) {
    // Rejects when the member should be given up on (see MemberHealth::watch).
    answer = answer.exclusiveJoin(pool.health.watch(member, idempotent).then([]() {
      return kj::Promise<kj::Own<AnyResponse>>(kj::NEVER_DONE);
    }));
  }
  auto finished = [this, counted, startedAt](bool failed) {
    KJ_IF_MAYBE(c, counted) {
      if (failed) ++c->failures;
      c->latency.record(pool.group.loop().timer().now() - startedAt);
    }
  };
  return answer.attach(kj::heap<Outstanding>(pool, member.endpoint.name))
      .then(
          [this, &member, finished](kj::Own<AnyResponse>&& response) {
            finished(false);
            pool.health.succeeded(member);
            return Attempted{AttemptEnd::ANSWERED, member, kj::mv(response), nullptr};
          },
          [this, &member, finished](kj::Exception&& e) {
            finished(true);
            noteFailure(pool.health, member, e);
            return Attempted{judge(e, idempotent), member, nullptr, kj::mv(e)};
          });
}

kj::Promise<PoolCall::Result> PoolCall::ended(Attempted&& a) {
  auto& member = a.member.endpoint;
  switch (a.end) {
    case AttemptEnd::ANSWERED:
      return done(kj::mv(a.response), nullptr);
    case AttemptEnd::ACTOR_RAISED:
    case AttemptEnd::FAILED:
      return done(nullptr, kj::mv(a.error));
    case AttemptEnd::MAY_HAVE_RUN: {
      auto& e = KJ_ASSERT_NONNULL(a.error);
      if (errorCode(e) == ErrorCode::MAY_HAVE_RUN) {
        return done(nullptr, makeError(ErrorCode::MAY_HAVE_RUN,
                                       kj::str("the call to ", member.name, " (", member.address,
                                               ") may have run there: ", errorMessage(e))));
      }
      return done(nullptr,
                  makeError(ErrorCode::MAY_HAVE_RUN,
                            kj::str("the call to ", member.name, " (", member.address,
                                    ") failed after it may have reached the actor, and it is not "
                                    "marked idempotent, so it was not sent again: ",
                                    e.getDescription())));
    }
    case AttemptEnd::FAILED_OVER:
      break;
  }
  auto& e = KJ_ASSERT_NONNULL(a.error);
  ++failedOn[member.name];
  if (attempts >= pool.options.maxAttempts) {
    return done(nullptr,
                makeError(errorCode(e), kj::str("gave up after ", attempts,
                                                " attempts; the last: ", e.getDescription())));
  }
  // Another member that this call has not failed on: go there at once.
  if (anyUntried()) return picking();
  auto& loop = pool.group.loop();
  auto wait = pool.backoff.delay(attempts - 1, loop.random());
  loop.logger()->debug("retrying a call to {}/{} in {} ms: {}", pool.group.jobId().cStr(),
                       pool.group.actorName().cStr(), wait / kj::MILLISECONDS,
                       e.getDescription().cStr());
  return loop.timer().afterDelay(wait).then([this]() { return picking(); });
}

PoolCall::Result PoolCall::done(kj::Maybe<kj::Own<AnyResponse>> response,
                                kj::Maybe<kj::Exception> error) {
  Result result;
  if (nameMember && last.get() != nullptr) result.endpoint = last->endpoint;
  result.value = kj::mv(response);
  result.error = kj::mv(error);
  result.latency = pool.group.loop().timer().now() - start;
  return result;
}

PoolCall::Result PoolCall::expired() {
  auto& group = pool.group;
  if (attempts == 0) {
    return done(nullptr, makeError(ErrorCode::NO_ENDPOINTS,
                                   kj::str("no member of ", group.jobId(), "/", group.actorName(),
                                           "- was ready within ", deadline / kj::MILLISECONDS,
                                           " ms; the call was not sent")));
  }
  return done(nullptr, makeError(ErrorCode::DEADLINE_EXCEEDED,
                                 kj::str("call to ", group.jobId(), "/", group.actorName(),
                                         "-* did not finish within ", deadline / kj::MILLISECONDS,
                                         " ms; it may have run")));
}

kj::Maybe<kj::Own<const GroupMember>> PoolCall::pick() {
  auto& group = pool.group;
  size_t n = group.readyCount();
  if (n == 0) return nullptr;
  // Prefer members this call has not failed on, and among those the ones not ejected; when
  // every such member is ejected, use them anyway: a pool must not refuse a call it could send.
  bool anyFresh = failedOn.empty() || anyUntried();
  kj::Maybe<kj::Own<const GroupMember>> chosen;
  for (bool healthy : {true, false}) {
    chosen = choose(n, [&](const GroupMember& m) {
      return !(anyFresh && tried(m)) && (!healthy || pool.health.available(m));
    });
    if (chosen != nullptr) break;
  }
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

bool PoolCall::anyUntried() const {
  auto& group = pool.group;
  for (size_t k = 0, n = group.readyCount(); k < n; ++k) {
    if (!tried(*group.readyMember(k))) return true;
  }
  return false;
}

kj::Maybe<PoolCounters::Member&> PoolCall::counting(const GroupMember& member) {
  ++attempts;
  if (!pool.options.metrics) return nullptr;
  auto& name = member.endpoint.name;
  auto& counted = pool.counters.member(name);
  ++counted.attempts;
  if (attempts > 1) {
    ++pool.counters.retries;
    if (last->endpoint.name != name) ++pool.counters.failovers;
  }
  return counted;
}

}  // namespace troupe::pool_detail
