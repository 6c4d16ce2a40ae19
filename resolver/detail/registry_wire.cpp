#include "troupe/resolver/detail/registry_wire.h"

#include <kj/vector.h>

namespace troupe::detail {

namespace {

std::string fromText(capnp::Text::Reader text) { return std::string(text.begin(), text.size()); }

kj::StringPtr asPtr(const std::string& s) { return kj::StringPtr(s.c_str(), s.size()); }

}  // namespace

schema::JobState jobStateToCapnp(JobState state) {
  return state == JobState::ENDED ? schema::JobState::ENDED : schema::JobState::RUNNING;
}

JobState jobStateFromCapnp(schema::JobState state) {
  // A state added by a newer peer: the job is not known to have ended.
  return state == schema::JobState::ENDED ? JobState::ENDED : JobState::RUNNING;
}

void writeJobStatus(const JobStatus& status, schema::JobStatus::Builder builder) {
  builder.setJobId(asPtr(status.jobId));
  builder.setState(jobStateToCapnp(status.state));
  builder.setReason(asPtr(status.reason));
}

JobStatus readJobStatus(schema::JobStatus::Reader reader) {
  return JobStatus{fromText(reader.getJobId()), jobStateFromCapnp(reader.getState()),
                   fromText(reader.getReason())};
}

void writeWatchEvent(const WatchEvent& event, schema::WatchEvent::Builder builder) {
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
      writeJobStatus(event.job, builder.initJobEnded());
      return;
  }
}

kj::Maybe<WatchEvent> readWatchEvent(schema::WatchEvent::Reader reader) {
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
      return WatchEvent{WatchEvent::Type::JOB_ENDED, {}, readJobStatus(reader.getJobEnded())};
  }
  return nullptr;
}

size_t endpointBytes(const Endpoint& endpoint) {
  size_t total = endpoint.name.size() + endpoint.address.size();
  for (auto& [key, value] : endpoint.metadata) total += key.size() + value.size();
  return total;
}

}  // namespace troupe::detail
