#pragma once
// Actors reached without their generated code: the server sends its schema (ActorHost.getSchema),
// a capnp::SchemaLoader takes it in, and calls go through Cap'n Proto's dynamic API with JSON
// for parameters and results.

#include <string>

#include <capnp/schema-loader.h>
#include <capnp/schema.h>
#include <kj/async.h>

#include "troupe/actor/channel.h"

namespace troupe::cli {

// One actor at one server, with its interface loaded.
struct DynamicActor {
  std::string name;  // as the server hosts it ("calc")
  capnp::InterfaceSchema schema;
  capnp::Capability::Client capability;
};

// Connects nothing itself: asks `channel`'s server for actor `name`'s capability and schema,
// loading the schema into `loader` (which must outlive the result).
kj::Promise<DynamicActor> openDynamicActor(Channel& channel, kj::StringPtr name,
                                           capnp::SchemaLoader& loader);

// "Calculator", "List(Float32)", "Text"...: a type as a schema file spells it.
std::string typeName(capnp::Type type);

// "add (a :Float64, b :Float64) -> (value :Float64)".
std::string describeMethod(capnp::InterfaceSchema::Method method);

// Calls `method` ("add") of `actor` with parameters decoded from the JSON object `json` and
// resolves with the results encoded as JSON (see CallJson: Data as base64). INVALID_ARGUMENT,
// thrown before anything is sent, for an unknown method (naming the known ones) or JSON that
// does not fit the parameters (saying why, and naming the parameter). DEADLINE_EXCEEDED when no
// answer came within `deadline`.
kj::Promise<std::string> callWithJson(DynamicActor& actor, kj::StringPtr method,
                                      kj::StringPtr json, kj::Duration deadline, kj::Timer& timer);

}  // namespace troupe::cli
