#include "troupe/resolver/registry_wire.h"

namespace troupe {

schema::JobState toCapnp(JobState state) {
  return state == JobState::ENDED ? schema::JobState::ENDED : schema::JobState::RUNNING;
}

JobState fromCapnp(schema::JobState state) {
  return state == schema::JobState::ENDED ? JobState::ENDED : JobState::RUNNING;
}

void toCapnp(const JobStatus& status, schema::JobStatus::Builder builder) {
  builder.setJobId(status.jobId);
  builder.setState(toCapnp(status.state));
  builder.setReason(status.reason);
}

JobStatus fromCapnp(schema::JobStatus::Reader reader) {
  return JobStatus{reader.getJobId(), fromCapnp(reader.getState()), reader.getReason()};
}

void toCapnp(const JobInfo& info, schema::JobInfo::Builder builder) {
  toCapnp(info.status, builder.initStatus());
  builder.setLauncher(info.launcher);
  builder.setReplicas(info.replicas);
  builder.setReady(info.ready);
  builder.setEndpoints(info.endpoints);
  builder.setCreatedAtMillis(info.createdAtMillis);
  builder.setEndedAtMillis(info.endedAtMillis);
}

JobInfo fromCapnp(schema::JobInfo::Reader reader) {
  JobInfo info;
  info.status = fromCapnp(reader.getStatus());
  info.launcher = reader.getLauncher();
  info.replicas = reader.getReplicas();
  info.ready = reader.getReady();
  info.endpoints = reader.getEndpoints();
  info.createdAtMillis = reader.getCreatedAtMillis();
  info.endedAtMillis = reader.getEndedAtMillis();
  return info;
}

void toCapnp(const WatchEvent& event, schema::WatchEvent::Builder builder) {
  switch (event.type) {
    case WatchEvent::Type::ADDED:
      event.endpoint.toCapnp(builder.initAdded());
      return;
    case WatchEvent::Type::CHANGED:
      event.endpoint.toCapnp(builder.initChanged());
      return;
    case WatchEvent::Type::REMOVED:
      event.endpoint.toCapnp(builder.initRemoved());
      return;
    case WatchEvent::Type::SYNCED:
      builder.setSynced();
      return;
    case WatchEvent::Type::JOB_ENDED:
      toCapnp(event.job, builder.initJobEnded());
      return;
  }
}

kj::Maybe<WatchEvent> fromCapnp(schema::WatchEvent::Reader reader) {
  switch (reader.which()) {
    case schema::WatchEvent::ADDED:
      return WatchEvent{WatchEvent::Type::ADDED, Endpoint::fromCapnp(reader.getAdded()), {}};
    case schema::WatchEvent::CHANGED:
      return WatchEvent{WatchEvent::Type::CHANGED, Endpoint::fromCapnp(reader.getChanged()), {}};
    case schema::WatchEvent::REMOVED:
      return WatchEvent{WatchEvent::Type::REMOVED, Endpoint::fromCapnp(reader.getRemoved()), {}};
    case schema::WatchEvent::SYNCED:
      return WatchEvent{WatchEvent::Type::SYNCED, {}, {}};
    case schema::WatchEvent::JOB_ENDED:
      return WatchEvent{WatchEvent::Type::JOB_ENDED, {}, fromCapnp(reader.getJobEnded())};
  }
  return nullptr;
}

}  // namespace troupe
