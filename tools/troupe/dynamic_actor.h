#pragma once
// Actors reached without their generated code: the server sends its schema (ActorHost.getSchema),
// a capnp::SchemaLoader takes it in, and calls go through Cap'n Proto's dynamic API with JSON
// for parameters and results.

#include <string>

#include <capnp/capability.h>
#include <capnp/dynamic.h>
#include <capnp/schema-loader.h>
#include <capnp/schema.h>
#include <kj/async.h>

#include "troupe/actor/dynamic_actor.h"
#include "troupe/net/channel.h"
#include "tools/troupe/call_json.h"

namespace troupe::cli {

// One method called with parameters given as JSON, ready to be sent to any actor with the
// interface; its results read back as JSON (see CallJson: Data as base64). Loop thread only.
class JsonCall {
public:
  // Finds `methodName` ("add") in `actor`'s interface and checks `json` against its parameters,
  // those it leaves out refused or left to their defaults as `missing` says. Throws
  // INVALID_ARGUMENT, before anything is sent, for an unknown method (naming the known ones) or
  // JSON that does not fit the parameters (saying why, and naming the parameter).
  JsonCall(const DynamicActor& actor, kj::StringPtr methodName, kj::StringPtr json,
           MissingParams missing);
  KJ_DISALLOW_COPY(JsonCall);

  // Sends the call to `capability`, an actor with the interface. The promise does not borrow
  // this JsonCall.
  capnp::RemotePromise<capnp::DynamicStruct> send(capnp::Capability::Client capability) const;

  // A response to send() as one line of JSON.
  std::string resultsJson(capnp::DynamicStruct::Reader results) const;

private:
  capnp::InterfaceSchema schema;
  capnp::InterfaceSchema::Method method;
  std::string json;
  std::string label;  // "calc.add", for messages
  MissingParams missing;
  CallJson codec;
};

}  // namespace troupe::cli
