// main() of the launcher tests (local and Slurm): the test binary is also the program its FUNCTION
// entrypoints run. A replica the launcher started takes over in runIfReplica(); otherwise
// GoogleTest runs.
//
// Functions:
//   print-args   prints "ARGS <n>", then "[<arg>]" per argument, "TASK <index>" and whether
//                TROUPE_ENTRYPOINT is still set; exits 0
//   exit-with    exits with the status its first argument names
//   member       hosts a test::Member actor named "member" (hostActor) until SIGTERM

#include <stdio.h>
#include <stdlib.h>

#include <gtest/gtest.h>

#include "troupe/jobs/job_request.h"
#include "troupe/resolver/host_actor.h"
#include "tests/support/test_actors.h"

int main(int argc, char** argv) {
  troupe::Entrypoints entrypoints;
  entrypoints.add("print-args", [](troupe::EventLoop&, std::vector<std::string> args) {
    printf("ARGS %zu\n", args.size());
    for (auto& a : args) printf("[%s]\n", a.c_str());
    const char* task = getenv("TROUPE_TASK_INDEX");
    printf("TASK %s\n", task != nullptr ? task : "?");
    printf("TROUPE_ENTRYPOINT %s\n", getenv("TROUPE_ENTRYPOINT") != nullptr ? "set" : "unset");
    fflush(stdout);
    return 0;
  });
  entrypoints.add("exit-with", [](troupe::EventLoop&, std::vector<std::string> args) {
    return args.empty() ? 0 : atoi(args[0].c_str());
  });
  entrypoints.add("member", [](troupe::EventLoop& loop, std::vector<std::string>) {
    auto name = troupe::JobContext::fromEnvironment().endpointName("member");
    return troupe::hostActor<troupe::test::Member>(loop, "member",
                                                   kj::heap<troupe::test::MemberImpl>(name));
  });
  KJ_IF_MAYBE(status, entrypoints.runIfReplica()) {
    return *status;
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
