#pragma once
// Endpoint: one hosted actor as a resolver publishes it, and the rules for endpoint names.

#include <cstdint>
#include <map>
#include <string>

#include <kj/common.h>
#include <kj/string.h>

#include "troupe/schemas/actor.capnp.h"

namespace troupe {

enum class EndpointState : uint8_t {
  STARTING,  // registered, not yet serving
  READY,     // serving calls
  DRAINING,  // refusing new calls while in-flight calls finish
};

// "starting", "ready", "draining".
kj::StringPtr toString(EndpointState state);

// A plain value: copies are independent.
struct Endpoint {
  std::string name;     // "<job_id>/<actor>-<task_index>"
  std::string address;  // "tcp://host:port" or "unix:/path"
  std::string jobId;
  std::string actor;
  uint32_t taskIndex = 0;
  uint64_t incarnation = 0;  // differs on every start of the hosting process
  EndpointState state = EndpointState::STARTING;
  std::map<std::string, std::string> metadata;
  // When the resolver accepted this incarnation (Unix time, ms), as the resolver reports it; 0
  // when it does not. Set by the resolver: what a registrant puts here is ignored.
  uint64_t registeredAtMillis = 0;

  void toCapnp(schema::Endpoint::Builder builder) const;
  static Endpoint fromCapnp(schema::Endpoint::Reader reader);
  bool operator==(const Endpoint&) const = default;
};

// What `endpoint`'s server published under `key` in its metadata; "" when nothing.
std::string metadataOf(const Endpoint& endpoint, const std::string& key);

// Where a client connects to `endpoint`: the unix socket its server publishes for the same host
// (ActorServerOptions::sameHost, net/same_host.h) when this process is on that host, in that
// network namespace, and the socket is there and belongs to this process's user; else
// endpoint.address.
std::string connectAddress(const Endpoint& endpoint);

// The same for a member known by its published `address`, and the same-host socket and host id
// its server published (empty when none).
std::string connectAddress(const std::string& address, const std::string& sameHostSocket,
                           const std::string& sameHostId);

schema::EndpointState toCapnp(EndpointState state);
EndpointState fromCapnp(schema::EndpointState state);

// Limits on names. Job ids and actor names use letters, digits, '.', '_' and '-', start with a
// letter or digit, and are at most MAX_NAME_LENGTH bytes.
constexpr size_t MAX_NAME_LENGTH = 128;

// Each throws INVALID_ARGUMENT (see errors.h) with the reason when the name breaks the rules.
void validateJobId(kj::StringPtr jobId);
void validateActorName(kj::StringPtr actor);

// "<job_id>/<actor>-<task_index>", validated.
std::string endpointName(kj::StringPtr jobId, kj::StringPtr actor, uint32_t taskIndex);

// The parts of a valid endpoint name; null for anything else. The actor part may itself contain
// '-': the task index is what follows the last one.
struct EndpointNameParts {
  std::string jobId;
  std::string actor;
  uint32_t taskIndex;
};
kj::Maybe<EndpointNameParts> parseEndpointName(kj::StringPtr name);

// Sets `endpoint`'s jobId, actor and taskIndex from its name, as a resolver does with every
// endpoint it accepts; false (changing nothing) when the name is not an endpoint name.
bool fillNameParts(Endpoint& endpoint);

// What a resolver says when a name is not an endpoint name: INVALID_ARGUMENT, "'<name>' is not an
// endpoint name (expected <job_id>/<actor>-<task_index>, ...)", with `name` made printable.
kj::Exception endpointNameError(kj::StringPtr name);

}  // namespace troupe
