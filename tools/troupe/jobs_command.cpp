// troupe jobs: the jobs launchers submitted to Slurm, as Slurm reports them now.

#include <stdio.h>

#include <string>

#include "troupe/jobs/slurm_launcher.h"
#include "tools/troupe/cli.h"
#include "tools/troupe/commands.h"

namespace troupe::cli {

namespace {

class JobsCommand final : public Command {
public:
  kj::MainFunc parser(kj::ProcessContext& context) override {
    return kj::MainBuilder(
               context, VERSION_TEXT,
               "Lists the jobs troupe launchers submitted to Slurm (yours, with the comment "
               "\"troupe\") that Slurm still knows, newest first: name, Slurm job id, Slurm's "
               "state, replicas, restarts and Slurm's reason. Jobs of the local launcher run in "
               "the foreground of their `troupe launch`, which shows their state.")
        .build();
  }

  int run() override {
    auto jobs = listSlurmJobs();
    if (jobs.empty()) return 0;
    printf("%-24s %10s  %-12s %8s %8s  %s\n", "NAME", "SLURM_ID", "STATE", "REPLICAS", "RESTARTS",
           "REASON");
    for (auto& job : jobs) {
      printf("%-24s %10llu  %-12s %8u %8u  %s\n", job.name.c_str(),
             static_cast<unsigned long long>(job.slurmId), job.state.c_str(), job.tasks,
             job.restarts, job.reason.c_str());
    }
    return 0;
  }
};

}  // namespace

kj::Own<Command> jobsCommand() { return kj::heap<JobsCommand>(); }

}  // namespace troupe::cli
