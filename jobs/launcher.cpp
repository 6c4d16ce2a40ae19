#include "troupe/jobs/launcher.h"

#include "troupe/base/errors.h"
#include "troupe/jobs/detail/replica_environment.h"

namespace troupe {

kj::StringPtr toString(JobPhase phase) {
  switch (phase) {
    case JobPhase::PENDING:
      return "pending";
    case JobPhase::RUNNING:
      return "running";
    case JobPhase::SUCCEEDED:
      return "succeeded";
    case JobPhase::FAILED:
      return "failed";
    case JobPhase::STOPPED:
      return "stopped";
    case JobPhase::UNSCHEDULABLE:
      return "unschedulable";
  }
  return "unknown";
}

bool isFinal(JobPhase phase) {
  switch (phase) {
    case JobPhase::PENDING:
    case JobPhase::RUNNING:
      return false;
    case JobPhase::SUCCEEDED:
    case JobPhase::FAILED:
    case JobPhase::STOPPED:
    case JobPhase::UNSCHEDULABLE:
      return true;
  }
  return false;
}

namespace {

kj::Promise<JobPhase> finalPhase(kj::Own<jobs_detail::Job> job) {
  auto phase = job->phase();
  if (isFinal(phase)) return phase;
  auto changed = job->whenChanged();
  return changed.then([job = kj::mv(job)]() mutable { return finalPhase(kj::mv(job)); });
}

}  // namespace

kj::Promise<JobPhase> JobHandle::wait(kj::Duration timeout) {
  auto expired = job->timer().afterDelay(timeout).then(
      [job = kj::addRef(*job), timeout]() -> kj::Promise<JobPhase> {
        return makeError(ErrorCode::DEADLINE_EXCEEDED,
                         kj::str("job '", job->id(), "' is still ", toString(job->phase()),
                                 " after ", timeout));
      });
  return finalPhase(kj::addRef(*job)).exclusiveJoin(kj::mv(expired));
}

kj::Maybe<std::string> findProgram(const std::string& name) {
  return jobs_detail::searchPath(name);
}

}  // namespace troupe
