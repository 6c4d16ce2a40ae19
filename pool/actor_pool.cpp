#include "troupe/pool/actor_pool.h"

#include <random>

#include <kj/debug.h>
#include <spdlog/spdlog.h>

#include "troupe/actor/errors.h"

namespace troupe {

ActorPoolBase::ActorPoolBase(ActorGroupBase& group, ActorPoolOptions options)
    : group_(group), options_(kj::mv(options)) {}

kj::Exception ActorPoolBase::deadlineError(kj::Duration deadline,
                                           const detail::CallProgress& progress) {
  if (!progress.attempted) {
    return makeError(ErrorCode::NO_ENDPOINTS,
                     kj::str("no member of ", group_.jobId(), "/", group_.actorName(),
                             "- was ready within ", deadline / kj::MILLISECONDS,
                             " ms; the call was not sent"));
  }
  return makeError(ErrorCode::DEADLINE_EXCEEDED,
                   kj::str("call to ", group_.jobId(), "/", group_.actorName(),
                           "-* did not finish within ", deadline / kj::MILLISECONDS,
                           " ms; it may have run"));
}

uint32_t ActorPoolBase::outstanding(const std::string& member) const {
  auto it = outstanding_.find(member);
  return it == outstanding_.end() ? 0 : it->second;
}

namespace detail {

namespace {

// Errors an actor (or the caller) caused: sending the call again cannot help.
bool isFinal(ErrorCode code) {
  switch (code) {
    case ErrorCode::FAILED:
    case ErrorCode::UNIMPLEMENTED:
    case ErrorCode::INVALID_ARGUMENT:
    case ErrorCode::MESSAGE_TOO_LARGE:
    case ErrorCode::JOB_ENDED:
    case ErrorCode::MAY_HAVE_RUN:
    case ErrorCode::ADDRESS_IN_USE:
    case ErrorCode::NAME_TAKEN:
      return true;
    default:
      return false;
  }
}

double jitter() {
  thread_local std::mt19937_64 random{std::random_device{}()};
  return std::uniform_real_distribution<double>(0.5, 1.0)(random);
}

}  // namespace

Outstanding::Outstanding(ActorPoolBase& pool, std::string member)
    : pool(pool), member(kj::mv(member)) {
  ++pool.outstanding_[this->member];
}

Outstanding::~Outstanding() noexcept(false) {
  auto it = pool.outstanding_.find(member);
  if (it != pool.outstanding_.end() && --it->second == 0) pool.outstanding_.erase(it);
}

PoolCall::PoolCall(ActorPoolBase& pool, const CallOptions& options)
    : pool(pool),
      progress_(kj::refcounted<CallProgress>()),
      idempotent(options.idempotent),
      deadline_(options.deadline.orDefault(pool.options().defaultDeadline)) {}

kj::Maybe<GroupMember&> PoolCall::pick() {
  auto ready = pool.group().readyMembers();
  if (ready.size() == 0) return nullptr;
  // Prefer members this call has not failed on.
  auto fresh = [&](GroupMember* m) { return failedOn.count(m->endpoint.name) == 0; };
  bool anyFresh = false;
  for (auto* m : ready) anyFresh = anyFresh || fresh(m);

  GroupMember* chosen = nullptr;
  if (pool.options().balancing == Balancing::LEAST_OUTSTANDING) {
    size_t n = ready.size();
    for (size_t k = 0; k < n; ++k) {
      auto* m = ready[(pool.nextIndex + k) % n];
      if (anyFresh && !fresh(m)) continue;
      if (chosen == nullptr ||
          pool.outstanding(m->endpoint.name) < pool.outstanding(chosen->endpoint.name)) {
        chosen = m;
      }
    }
    ++pool.nextIndex;
  } else {
    size_t n = ready.size();
    for (size_t k = 0; k < n; ++k) {
      auto* m = ready[pool.nextIndex++ % n];
      if (!anyFresh || fresh(m)) {
        chosen = m;
        break;
      }
    }
  }
  ++attempts;
  progress_->attempted = true;
  return *chosen;
}

kj::Promise<void> PoolCall::afterFailure(kj::Exception&& e, const Endpoint& member) {
  auto code = errorCode(e);
  if (raisedByActor(e) || isFinal(code)) return kj::mv(e);
  bool retry = callNeverRan(code) || idempotent;
  if (!retry) {
    return makeError(ErrorCode::MAY_HAVE_RUN,
                     kj::str("the call to ", member.name.c_str(), " (", member.address.c_str(),
                             ") failed after it may have reached the actor, and it is not marked "
                             "idempotent, so it was not sent again: ",
                             e.getDescription()));
  }
  ++failedOn[member.name];
  // Another member that this call has not failed on: go there at once.
  bool another = false;
  for (auto* m : pool.group().readyMembers()) {
    if (failedOn.count(m->endpoint.name) == 0) another = true;
  }
  return retryLater(kj::mv(e), another);
}

kj::Promise<void> PoolCall::afterNoMember() {
  KJ_IF_MAYBE(job, pool.group().jobEnded()) {
    return makeError(ErrorCode::JOB_ENDED, kj::str("job '", job->jobId.c_str(), "' has ended (",
                                                   job->reason.c_str(), ")"));
  }
  return pool.group().whenChanged();
}

kj::Promise<void> PoolCall::retryLater(kj::Exception&& e, bool immediately) {
  auto& options = pool.options();
  if (attempts >= options.maxAttempts) {
    return makeError(errorCode(e), kj::str("gave up after ", attempts, " attempts; the last: ",
                                           e.getDescription()));
  }
  if (immediately) return kj::READY_NOW;
  double backoff = static_cast<double>(options.initialBackoff / kj::NANOSECONDS);
  for (uint32_t i = 1; i < attempts && backoff < 1e12; ++i) backoff *= 2;
  backoff = std::min(backoff, static_cast<double>(options.maxBackoff / kj::NANOSECONDS));
  auto wait = static_cast<int64_t>(backoff * jitter()) * kj::NANOSECONDS;
  pool.group().loop().logger()->debug("retrying a call to {}/{} in {} ms: {}",
                                      pool.group().jobId().cStr(),
                                      pool.group().actorName().cStr(), wait / kj::MILLISECONDS,
                                      e.getDescription().cStr());
  return pool.group().loop().timer().afterDelay(wait);
}

}  // namespace detail

}  // namespace troupe
