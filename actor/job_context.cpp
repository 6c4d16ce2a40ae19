#include "troupe/actor/job_context.h"

#include <stdlib.h>

#include "troupe/actor/endpoint.h"
#include "troupe/base/errors.h"
#include "troupe/base/parse_number.h"

namespace troupe {

namespace {

struct Found {
  kj::StringPtr variable;
  kj::StringPtr value;
};

// The first of `names` that is set to a non-empty value.
kj::Maybe<Found> firstSet(JobContext::EnvLookup& getenv,
                          std::initializer_list<kj::StringPtr> names) {
  for (auto name : names) {
    KJ_IF_MAYBE(value, getenv(name)) {
      if (value->size() > 0) return Found{name, *value};
    }
  }
  return nullptr;
}

uint32_t parseCount(const Found& found) {
  KJ_IF_MAYBE(value, parseWholeNumber(found.value, UINT32_MAX)) {
    return static_cast<uint32_t>(*value);
  }
  throwError(ErrorCode::INVALID_ARGUMENT,
             kj::str(found.variable, "='", found.value, "' is not a non-negative integer"));
}

}  // namespace

JobContext JobContext::fromEnvironment() {
  return fromEnvironment([](kj::StringPtr name) -> kj::Maybe<kj::StringPtr> {
    const char* value = ::getenv(name.cStr());
    if (value == nullptr) return nullptr;
    return kj::StringPtr(value);
  });
}

JobContext JobContext::fromEnvironment(EnvLookup getenv) {
  JobContext ctx;
  KJ_IF_MAYBE(found, firstSet(getenv, {"TROUPE_JOB_ID", "SLURM_JOB_ID"})) {
    KJ_IF_MAYBE(e, kj::runCatchingExceptions([&]() { validateJobId(found->value); })) {
      throwError(ErrorCode::INVALID_ARGUMENT, kj::str(found->variable, ": ", errorMessage(*e)));
    }
    ctx.jobId = found->value.cStr();
  }
  kj::StringPtr indexSource = "default";
  KJ_IF_MAYBE(found,
              firstSet(getenv, {"TROUPE_TASK_INDEX", "SLURM_PROCID", "JOB_COMPLETION_INDEX"})) {
    ctx.taskIndex = parseCount(*found);
    indexSource = found->variable;
  }
  kj::StringPtr countSource = "default";
  KJ_IF_MAYBE(found, firstSet(getenv, {"TROUPE_NUM_TASKS", "SLURM_NTASKS"})) {
    ctx.numTasks = parseCount(*found);
    countSource = found->variable;
    if (ctx.numTasks == 0) {
      throwError(ErrorCode::INVALID_ARGUMENT, kj::str(found->variable, " must be at least 1"));
    }
  }
  if (ctx.taskIndex >= ctx.numTasks) {
    if (countSource == "default" && ctx.taskIndex < UINT32_MAX) {
      // An index without a count (a Kubernetes indexed job, say): the job has at least that many.
      ctx.numTasks = ctx.taskIndex + 1;
    } else {
      throwError(ErrorCode::INVALID_ARGUMENT,
                 kj::str("task index ", ctx.taskIndex, " (", indexSource,
                         ") is not below the task count ", ctx.numTasks, " (", countSource, ")"));
    }
  }
  KJ_IF_MAYBE(found, firstSet(getenv, {"TROUPE_RESOLVER"})) {
    ctx.resolver = found->value.cStr();
  }
  KJ_IF_MAYBE(found, firstSet(getenv, {"TROUPE_ADVERTISE_HOST"})) {
    ctx.advertiseHost = found->value.cStr();
  }
  KJ_IF_MAYBE(found, firstSet(getenv, {"TROUPE_METRICS"})) {
    ctx.metricsAddress = found->value.cStr();
  }
  return ctx;
}

std::string JobContext::endpointName(kj::StringPtr actor) const {
  return troupe::endpointName(jobId, actor, taskIndex);
}

}  // namespace troupe
