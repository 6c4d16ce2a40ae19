// JobRequest validation and Entrypoints' registry of functions.

#include "troupe/jobs/job_request.h"

#include <gtest/gtest.h>

#include "tests/support/registry_helpers.h"

namespace troupe {
namespace {

using test::thrownBy;

JobRequest valid() {
  return JobRequest{.name = "ps-1.a_b",
                    .entrypoint = Entrypoint::binary("/bin/true", {"--x"}),
                    .resources = ResourceConfig::withCpu(1, "1g")};
}

TEST(JobRequestTest, AValidRequestPassesAndItsReplicasDefaultToTheResources) {
  auto req = valid();
  req.validate();
  EXPECT_EQ(req.replicaCount(), 1u);
  req.resources.replicas = 3;
  EXPECT_EQ(req.replicaCount(), 3u);
  req.replicas = 5;
  EXPECT_EQ(req.replicaCount(), 5u);
}

TEST(JobRequestTest, BadNamesAreRefusedSayingWhy) {
  for (const char* name : {"", "has space", "a/b", "-leading", "tab\there"}) {
    auto req = valid();
    req.name = name;
    auto failure = thrownBy([&]() { req.validate(); });
    EXPECT_EQ(failure.code, ErrorCode::INVALID_ARGUMENT) << name;
    EXPECT_TRUE(failure.mentions("name")) << failure.text;
  }
  auto req = valid();
  req.name = std::string(MAX_NAME_LENGTH + 1, 'a');
  EXPECT_EQ(thrownBy([&]() { req.validate(); }).code, ErrorCode::INVALID_ARGUMENT);
}

TEST(JobRequestTest, BadEntrypointsResourcesAndEnvironmentAreRefused) {
  auto noPath = valid();
  noPath.entrypoint = Entrypoint::binary("");
  EXPECT_TRUE(thrownBy([&]() { noPath.validate(); }).mentions("path is empty"));

  auto noFunction = valid();
  noFunction.entrypoint = Entrypoint::function("");
  EXPECT_TRUE(thrownBy([&]() { noFunction.validate(); }).mentions("name is empty"));

  auto badResources = valid();
  badResources.resources.cpu = -1;
  auto failure = thrownBy([&]() { badResources.validate(); });
  EXPECT_EQ(failure.code, ErrorCode::INVALID_ARGUMENT);
  EXPECT_TRUE(failure.mentions("resources")) << failure.text;

  for (const char* name : {"", "A=B", "NEW\nLINE"}) {
    auto badEnv = valid();
    badEnv.environment[name] = "x";
    auto f = thrownBy([&]() { badEnv.validate(); });
    EXPECT_EQ(f.code, ErrorCode::INVALID_ARGUMENT) << name;
    EXPECT_TRUE(f.mentions("environment variable name")) << f.text;
  }
}

TEST(EntrypointsTest, FunctionsAreRegisteredOnceByName) {
  Entrypoints entrypoints;
  entrypoints.add("f", [](EventLoop&, std::vector<std::string>) { return 0; });
  EXPECT_TRUE(entrypoints.has("f"));
  EXPECT_FALSE(entrypoints.has("g"));
  auto twice = thrownBy(
      [&]() { entrypoints.add("f", [](EventLoop&, std::vector<std::string>) { return 1; }); });
  EXPECT_EQ(twice.code, ErrorCode::INVALID_ARGUMENT);
  EXPECT_TRUE(twice.mentions("already registered")) << twice.text;
  EXPECT_EQ(Entrypoints::replicaCommandLine(Entrypoint::function("f", {"a", "--"})),
            (std::vector<std::string>{"--troupe-entrypoint", "f", "--", "a", "--"}));
  // This test process was not started as a replica.
  EXPECT_TRUE(entrypoints.runIfReplica() == nullptr);
}

}  // namespace
}  // namespace troupe
