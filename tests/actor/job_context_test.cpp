// job_context.h: JobContext::fromEnvironment() over an injected environment (the real process
// environment is never read or changed here).

#include "troupe/actor/job_context.h"

#include <map>
#include <string>

#include <gtest/gtest.h>

#include "troupe/base/errors.h"

namespace troupe {
namespace {

using Env = std::map<std::string, std::string>;

std::string str(kj::StringPtr s) { return std::string(s.begin(), s.size()); }

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

// A lookup over `env`, which must outlive the call.
JobContext::EnvLookup lookupIn(const Env& env) {
  return [&env](kj::StringPtr name) -> kj::Maybe<kj::StringPtr> {
    auto it = env.find(std::string(name.begin(), name.size()));
    if (it == env.end()) return nullptr;
    return kj::StringPtr(it->second.c_str(), it->second.size());
  };
}

JobContext fromEnv(const Env& env) { return JobContext::fromEnvironment(lookupIn(env)); }

// The description of the INVALID_ARGUMENT fromEnvironment(env) throws; fails the test when it
// throws nothing or something else.
std::string invalidArgument(const Env& env) {
  try {
    auto ctx = fromEnv(env);
    ADD_FAILURE() << "no exception; got jobId=" << ctx.jobId << " taskIndex=" << ctx.taskIndex
                  << " numTasks=" << ctx.numTasks;
  } catch (const kj::Exception& e) {
    EXPECT_EQ(errorCode(e), ErrorCode::INVALID_ARGUMENT) << str(e.getDescription());
    return str(e.getDescription());
  }
  return "";
}

TEST(JobContextTest, EmptyEnvironmentGivesDefaults) {
  auto ctx = fromEnv({});
  EXPECT_EQ(ctx.jobId, "local");
  EXPECT_EQ(ctx.taskIndex, 0u);
  EXPECT_EQ(ctx.numTasks, 1u);
  EXPECT_EQ(ctx.resolver, "");
  EXPECT_EQ(ctx.advertiseHost, "");
}

TEST(JobContextTest, DefaultConstructedMatchesEmptyEnvironment) {
  JobContext ctx;
  EXPECT_EQ(ctx.jobId, "local");
  EXPECT_EQ(ctx.taskIndex, 0u);
  EXPECT_EQ(ctx.numTasks, 1u);
}

TEST(JobContextTest, UnrelatedVariablesAreIgnored) {
  auto ctx = fromEnv({{"HOME", "/root"}, {"TROUPE_JOBID", "x"}, {"troupe_job_id", "y"}});
  EXPECT_EQ(ctx.jobId, "local");
}

TEST(JobContextTest, ReadsTroupeVariables) {
  auto ctx = fromEnv({{"TROUPE_JOB_ID", "train-7"},
                      {"TROUPE_TASK_INDEX", "2"},
                      {"TROUPE_NUM_TASKS", "4"},
                      {"TROUPE_RESOLVER", "registry://host:7700"},
                      {"TROUPE_ADVERTISE_HOST", "node12.cluster"}});
  EXPECT_EQ(ctx.jobId, "train-7");
  EXPECT_EQ(ctx.taskIndex, 2u);
  EXPECT_EQ(ctx.numTasks, 4u);
  EXPECT_EQ(ctx.resolver, "registry://host:7700");
  EXPECT_EQ(ctx.advertiseHost, "node12.cluster");
}

TEST(JobContextTest, LastIndexIsAccepted) {
  auto ctx = fromEnv({{"TROUPE_TASK_INDEX", "3"}, {"TROUPE_NUM_TASKS", "4"}});
  EXPECT_EQ(ctx.taskIndex, 3u);
  EXPECT_EQ(ctx.numTasks, 4u);
}

TEST(JobContextTest, LargestCountIsAccepted) {
  auto ctx = fromEnv({{"TROUPE_TASK_INDEX", "4294967294"}, {"TROUPE_NUM_TASKS", "4294967295"}});
  EXPECT_EQ(ctx.taskIndex, 4294967294u);
  EXPECT_EQ(ctx.numTasks, 4294967295u);
}

TEST(JobContextTest, FallsBackToSlurm) {
  auto ctx = fromEnv({{"SLURM_JOB_ID", "123456"}, {"SLURM_PROCID", "5"}, {"SLURM_NTASKS", "8"}});
  EXPECT_EQ(ctx.jobId, "123456");
  EXPECT_EQ(ctx.taskIndex, 5u);
  EXPECT_EQ(ctx.numTasks, 8u);
}

TEST(JobContextTest, FallsBackToJobCompletionIndex) {
  auto ctx = fromEnv({{"JOB_COMPLETION_INDEX", "3"}, {"TROUPE_NUM_TASKS", "10"}});
  EXPECT_EQ(ctx.taskIndex, 3u);
  EXPECT_EQ(ctx.numTasks, 10u);
}

TEST(JobContextTest, IndexWithoutCountImpliesAtLeastThatManyTasks) {
  auto k8s = fromEnv({{"JOB_COMPLETION_INDEX", "5"}});
  EXPECT_EQ(k8s.taskIndex, 5u);
  EXPECT_EQ(k8s.numTasks, 6u);
  auto troupe = fromEnv({{"TROUPE_TASK_INDEX", "0"}});
  EXPECT_EQ(troupe.taskIndex, 0u);
  EXPECT_EQ(troupe.numTasks, 1u);
}

TEST(JobContextTest, LargestIndexWithoutCountKeepsIndexBelowCount) {
  // taskIndex = UINT32_MAX cannot satisfy taskIndex < numTasks in a uint32_t: it must be refused,
  // not wrap numTasks around to 0.
  Env env{{"TROUPE_TASK_INDEX", "4294967295"}};
  try {
    auto ctx = fromEnv(env);
    EXPECT_LT(ctx.taskIndex, ctx.numTasks)
        << "taskIndex=" << ctx.taskIndex << " numTasks=" << ctx.numTasks;
  } catch (const kj::Exception& e) {
    EXPECT_EQ(errorCode(e), ErrorCode::INVALID_ARGUMENT) << str(e.getDescription());
  }
}

TEST(JobContextTest, TroupeVariablesWinOverSlurm) {
  auto ctx = fromEnv({{"TROUPE_JOB_ID", "mine"},
                      {"SLURM_JOB_ID", "999"},
                      {"TROUPE_TASK_INDEX", "1"},
                      {"SLURM_PROCID", "7"},
                      {"JOB_COMPLETION_INDEX", "9"},
                      {"TROUPE_NUM_TASKS", "2"},
                      {"SLURM_NTASKS", "16"}});
  EXPECT_EQ(ctx.jobId, "mine");
  EXPECT_EQ(ctx.taskIndex, 1u);
  EXPECT_EQ(ctx.numTasks, 2u);
}

TEST(JobContextTest, SlurmProcIdWinsOverJobCompletionIndex) {
  auto ctx = fromEnv({{"SLURM_PROCID", "2"}, {"JOB_COMPLETION_INDEX", "9"}, {"SLURM_NTASKS", "4"}});
  EXPECT_EQ(ctx.taskIndex, 2u);
}

TEST(JobContextTest, SourcesMixPerField) {
  // Each field takes the first source that sets it.
  auto ctx = fromEnv({{"SLURM_JOB_ID", "42"}, {"TROUPE_TASK_INDEX", "3"}, {"SLURM_NTASKS", "4"}});
  EXPECT_EQ(ctx.jobId, "42");
  EXPECT_EQ(ctx.taskIndex, 3u);
  EXPECT_EQ(ctx.numTasks, 4u);
}

TEST(JobContextTest, EmptyValuesCountAsUnset) {
  auto ctx = fromEnv({{"TROUPE_JOB_ID", ""},
                      {"SLURM_JOB_ID", "77"},
                      {"TROUPE_TASK_INDEX", ""},
                      {"SLURM_PROCID", ""},
                      {"JOB_COMPLETION_INDEX", "1"},
                      {"TROUPE_NUM_TASKS", ""},
                      {"SLURM_NTASKS", "3"},
                      {"TROUPE_RESOLVER", ""},
                      {"TROUPE_ADVERTISE_HOST", ""}});
  EXPECT_EQ(ctx.jobId, "77");
  EXPECT_EQ(ctx.taskIndex, 1u);
  EXPECT_EQ(ctx.numTasks, 3u);
  EXPECT_EQ(ctx.resolver, "");
  EXPECT_EQ(ctx.advertiseHost, "");
}

TEST(JobContextTest, AllEmptyIsTheDefault) {
  auto ctx = fromEnv({{"TROUPE_JOB_ID", ""}, {"TROUPE_TASK_INDEX", ""}, {"TROUPE_NUM_TASKS", ""}});
  EXPECT_EQ(ctx.jobId, "local");
  EXPECT_EQ(ctx.taskIndex, 0u);
  EXPECT_EQ(ctx.numTasks, 1u);
}

TEST(JobContextTest, NonNumericIndexNamesTheVariable) {
  for (const char* value :
       {"abc", "-1", "+1", " 1", "1 ", "1.0", "0x1", "4294967296", "99999999999"}) {
    SCOPED_TRACE(value);
    auto msg = invalidArgument({{"TROUPE_TASK_INDEX", value}, {"TROUPE_NUM_TASKS", "4"}});
    EXPECT_TRUE(contains(msg, "TROUPE_TASK_INDEX")) << msg;
    EXPECT_TRUE(contains(msg, value)) << msg;
  }
  auto slurm = invalidArgument({{"SLURM_PROCID", "x"}});
  EXPECT_TRUE(contains(slurm, "SLURM_PROCID")) << slurm;
  auto k8s = invalidArgument({{"JOB_COMPLETION_INDEX", "x"}});
  EXPECT_TRUE(contains(k8s, "JOB_COMPLETION_INDEX")) << k8s;
}

TEST(JobContextTest, NonNumericCountNamesTheVariable) {
  auto msg = invalidArgument({{"TROUPE_NUM_TASKS", "four"}});
  EXPECT_TRUE(contains(msg, "TROUPE_NUM_TASKS")) << msg;
  EXPECT_TRUE(contains(msg, "four")) << msg;
  auto slurm = invalidArgument({{"SLURM_NTASKS", "-2"}});
  EXPECT_TRUE(contains(slurm, "SLURM_NTASKS")) << slurm;
}

TEST(JobContextTest, IndexNotBelowCountIsRejected) {
  auto equal = invalidArgument({{"TROUPE_TASK_INDEX", "4"}, {"TROUPE_NUM_TASKS", "4"}});
  EXPECT_TRUE(contains(equal, "4")) << equal;
  EXPECT_TRUE(contains(equal, "TROUPE_NUM_TASKS")) << equal;
  auto above = invalidArgument({{"SLURM_PROCID", "9"}, {"SLURM_NTASKS", "8"}});
  EXPECT_TRUE(contains(above, "9")) << above;
  EXPECT_TRUE(contains(above, "8")) << above;
  EXPECT_TRUE(contains(above, "SLURM_NTASKS")) << above;
}

TEST(JobContextTest, ZeroCountIsRejected) {
  auto msg = invalidArgument({{"TROUPE_NUM_TASKS", "0"}});
  EXPECT_TRUE(contains(msg, "TROUPE_NUM_TASKS")) << msg;
  EXPECT_TRUE(contains(msg, "at least 1")) << msg;
  auto slurm = invalidArgument({{"SLURM_NTASKS", "0"}});
  EXPECT_TRUE(contains(slurm, "SLURM_NTASKS")) << slurm;
}

TEST(JobContextTest, BadJobIdNamesTheVariable) {
  auto troupe = invalidArgument({{"TROUPE_JOB_ID", "my job"}});
  EXPECT_TRUE(contains(troupe, "my job")) << troupe;
  EXPECT_TRUE(contains(troupe, "TROUPE_JOB_ID")) << troupe;
  auto slurm = invalidArgument({{"SLURM_JOB_ID", "a/b"}});
  EXPECT_TRUE(contains(slurm, "a/b")) << slurm;
  EXPECT_TRUE(contains(slurm, "SLURM_JOB_ID")) << slurm;
  auto longId = invalidArgument({{"TROUPE_JOB_ID", std::string(129, 'j')}});
  EXPECT_TRUE(contains(longId, "TROUPE_JOB_ID")) << longId;
}

TEST(JobContextTest, BadTroupeJobIdIsNotMaskedBySlurm) {
  // The first set variable is the one used; a broken one does not fall through to the next.
  auto msg = invalidArgument({{"TROUPE_JOB_ID", "-bad"}, {"SLURM_JOB_ID", "123"}});
  EXPECT_TRUE(contains(msg, "-bad")) << msg;
}

TEST(JobContextTest, ResolverAndAdvertiseHostAreTakenVerbatim) {
  auto ctx = fromEnv(
      {{"TROUPE_RESOLVER", "fixed:job/a-0=tcp://h:1"}, {"TROUPE_ADVERTISE_HOST", "[::1]"}});
  EXPECT_EQ(ctx.resolver, "fixed:job/a-0=tcp://h:1");
  EXPECT_EQ(ctx.advertiseHost, "[::1]");
}

TEST(JobContextTest, LooksUpOnlyTheDocumentedVariables) {
  std::map<std::string, int> asked;
  JobContext::fromEnvironment([&](kj::StringPtr name) -> kj::Maybe<kj::StringPtr> {
    ++asked[std::string(name.begin(), name.size())];
    return nullptr;
  });
  for (auto& [name, count] : asked) {
    EXPECT_TRUE(name == "TROUPE_JOB_ID" || name == "SLURM_JOB_ID" || name == "TROUPE_TASK_INDEX" ||
                name == "SLURM_PROCID" || name == "JOB_COMPLETION_INDEX" ||
                name == "TROUPE_NUM_TASKS" || name == "SLURM_NTASKS" || name == "TROUPE_RESOLVER" ||
                name == "TROUPE_ADVERTISE_HOST" || name == "TROUPE_METRICS")
        << name;
  }
  EXPECT_EQ(asked.size(), 10u);
}

TEST(JobContextTest, TroupeMetricsSaysWhereTheServerServesHttp) {
  EXPECT_EQ(fromEnv({{"TROUPE_METRICS", "0.0.0.0:0"}}).metricsAddress, "0.0.0.0:0");
  EXPECT_EQ(fromEnv({}).metricsAddress, "");
}

TEST(JobContextTest, EndpointNameUsesJobAndIndex) {
  auto ctx = fromEnv(
      {{"TROUPE_JOB_ID", "job-1"}, {"TROUPE_TASK_INDEX", "3"}, {"TROUPE_NUM_TASKS", "4"}});
  EXPECT_EQ(ctx.endpointName("calc"), "job-1/calc-3");
  EXPECT_EQ(ctx.endpointName("my-actor"), "job-1/my-actor-3");
  EXPECT_EQ(fromEnv({}).endpointName("calc"), "local/calc-0");
}

TEST(JobContextTest, EndpointNameRejectsBadActor) {
  auto ctx = fromEnv({});
  for (const char* actor : {"", "a/b", "_x", "a b"}) {
    SCOPED_TRACE(actor);
    try {
      ctx.endpointName(actor);
      ADD_FAILURE() << "no exception";
    } catch (const kj::Exception& e) {
      EXPECT_EQ(errorCode(e), ErrorCode::INVALID_ARGUMENT) << str(e.getDescription());
      EXPECT_TRUE(contains(str(e.getDescription()), "actor name")) << str(e.getDescription());
    }
  }
}

}  // namespace
}  // namespace troupe
