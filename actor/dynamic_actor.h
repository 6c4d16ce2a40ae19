#pragma once
// Actors reached without their generated code: the server sends its schema (ActorHost.getSchema),
// a capnp::SchemaLoader takes it in, and calls go through Cap'n Proto's dynamic API
// (capnp::DynamicCapability). What `troupe call` and the Python module build on.

#include <string>

#include <capnp/capability.h>
#include <capnp/dynamic.h>
#include <capnp/schema-loader.h>
#include <capnp/schema.h>
#include <kj/async.h>

#include "troupe/net/channel.h"

namespace troupe {

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
std::string capnpTypeName(capnp::Type type);

// "add (a :Float64, b :Float64) -> (value :Float64)".
std::string describeMethod(capnp::InterfaceSchema::Method method);

// The method of `schema` (or of an interface it extends) named `name`; throws
// INVALID_ARGUMENT naming the interface's methods when there is none.
capnp::InterfaceSchema::Method findMethod(capnp::InterfaceSchema schema, kj::StringPtr name);

}  // namespace troupe
