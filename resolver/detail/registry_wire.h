#pragma once
// Conversions between troupe's resolver types and the registry's wire types (registry.capnp),
// shared by RegistryServer and RegistryResolver.

#include <kj/string.h>

#include "troupe/resolver/resolver.h"
#include "troupe/schemas/registry.capnp.h"

namespace troupe::detail {

schema::JobState jobStateToCapnp(JobState state);
JobState jobStateFromCapnp(schema::JobState state);

void writeJobStatus(const JobStatus& status, schema::JobStatus::Builder builder);
JobStatus readJobStatus(schema::JobStatus::Reader reader);

void writeWatchEvent(const WatchEvent& event, schema::WatchEvent::Builder builder);

// The event, or null for a kind this build does not know (sent by a newer registry).
kj::Maybe<WatchEvent> readWatchEvent(schema::WatchEvent::Reader reader);

// What an endpoint costs a registry to keep, in bytes: its name, address and metadata keys and
// values (the parts of the name that are repeated in jobId and actor are not counted again).
size_t endpointBytes(const Endpoint& endpoint);


}  // namespace troupe::detail
