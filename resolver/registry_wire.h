#pragma once
// Conversions between troupe's resolver values and the registry's wire types
// (schemas/registry.capnp), for RegistryServer, RegistryResolver and any program that speaks the
// registry's protocol itself (a Watcher of its own, say).

#include <kj/common.h>

#include "troupe/resolver/resolver.h"
#include "troupe/schemas/registry.capnp.h"

namespace troupe {

schema::JobState toCapnp(JobState state);
// A state added by a newer peer reads as RUNNING: the job is not known to have ended.
JobState fromCapnp(schema::JobState state);

void toCapnp(const JobStatus& status, schema::JobStatus::Builder builder);
JobStatus fromCapnp(schema::JobStatus::Reader reader);

void toCapnp(const JobInfo& info, schema::JobInfo::Builder builder);
JobInfo fromCapnp(schema::JobInfo::Reader reader);

void toCapnp(const WatchEvent& event, schema::WatchEvent::Builder builder);
// The event, or null for a kind this build does not know (sent by a newer registry).
kj::Maybe<WatchEvent> fromCapnp(schema::WatchEvent::Reader reader);

}  // namespace troupe
