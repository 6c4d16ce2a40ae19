#pragma once
// Building Resolver::jobs()' answer from what a resolver keeps: the jobs it has records of, and
// the endpoints of every job.

#include <map>
#include <set>
#include <string>

#include "troupe/resolver/resolver.h"

namespace troupe::resolver_detail {

class JobList {
public:
  // Starts from the jobs with records (their `ready` and `endpoints` are recounted).
  void addRecord(JobInfo job);

  // Counts `endpoint` for its job; a job without a record is listed RUNNING, first seen at its
  // oldest registration.
  void count(const Endpoint& endpoint);

  // Every job, sorted by id.
  kj::Array<JobInfo> finish();

private:
  std::map<std::string, JobInfo, std::less<>> jobs;
  std::map<std::string, std::set<uint32_t>, std::less<>> readyTasks;
};

}  // namespace troupe::resolver_detail
