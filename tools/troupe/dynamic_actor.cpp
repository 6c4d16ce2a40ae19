#include "tools/troupe/dynamic_actor.h"

#include <capnp/dynamic.h>
#include <capnp/message.h>
#include <kj/debug.h>

namespace troupe::cli {

JsonCall::JsonCall(const DynamicActor& actor, kj::StringPtr methodName, kj::StringPtr json,
                   MissingParams missing)
    : schema(actor.schema),
      method(findMethod(actor.schema, methodName)),
      json(json.cStr()),
      label(kj::str(actor.name.c_str(), ".", methodName).cStr()),
      missing(missing) {
  // Read once here, so that bad parameters fail before any call is sent.
  capnp::MallocMessageBuilder scratch;
  codec.decodeParams(json, scratch.initRoot<capnp::DynamicStruct>(method.getParamType()),
                     label.c_str(), missing);
}

capnp::RemotePromise<capnp::DynamicStruct> JsonCall::send(
    capnp::Capability::Client capability) const {
  auto request = capability.castAs<capnp::DynamicCapability>(schema).newRequest(method);
  codec.decodeParams(json.c_str(), request, label.c_str(), missing);
  return request.send();
}

std::string JsonCall::resultsJson(capnp::DynamicStruct::Reader results) const {
  return codec.encodeResults(results).cStr();
}

}  // namespace troupe::cli
