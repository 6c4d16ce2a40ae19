#include "troupe/resolver/detail/job_list.h"

namespace troupe::resolver_detail {

void JobList::addRecord(JobInfo job) {
  job.ready = 0;
  job.endpoints = 0;
  auto id = job.status.jobId;
  jobs.insert_or_assign(kj::mv(id), kj::mv(job));
}

void JobList::count(const Endpoint& endpoint) {
  auto registered = static_cast<int64_t>(endpoint.registeredAtMillis);
  auto [it, added] = jobs.try_emplace(endpoint.jobId);
  auto& job = it->second;
  if (added) job.status = JobStatus{endpoint.jobId, JobState::RUNNING, ""};
  // A job nobody created was first seen at its oldest registration.
  bool open = job.launcher.empty();
  if (open && registered != 0 && (job.createdAtMillis == 0 || registered < job.createdAtMillis))
    job.createdAtMillis = registered;
  ++job.endpoints;
  if (endpoint.state == EndpointState::READY) readyTasks[endpoint.jobId].insert(endpoint.taskIndex);
}

kj::Array<JobInfo> JobList::finish() {
  auto out = kj::heapArrayBuilder<JobInfo>(jobs.size());
  for (auto& [id, job] : jobs) {
    auto ready = readyTasks.find(id);
    if (ready != readyTasks.end()) job.ready = static_cast<uint32_t>(ready->second.size());
    out.add(kj::mv(job));
  }
  jobs.clear();
  readyTasks.clear();
  return out.finish();
}

}  // namespace troupe::resolver_detail
