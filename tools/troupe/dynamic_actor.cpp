#include "tools/troupe/dynamic_actor.h"

#include <capnp/dynamic.h>
#include <capnp/message.h>
#include <kj/debug.h>

#include "troupe/base/errors.h"

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

kj::Promise<std::string> callWithJson(DynamicActor& actor, kj::StringPtr method, kj::StringPtr json,
                                      MissingParams missing, kj::Duration deadline,
                                      kj::Timer& timer) {
  auto call = kj::heap<JsonCall>(actor, method, json, missing);
  auto sent = call->send(actor.capability);
  auto results = sent.then([&call = *call](capnp::Response<capnp::DynamicStruct> response) {
                       return call.resultsJson(response);
                     })
                     .attach(kj::mv(call));
  return timer.timeoutAfter(deadline, kj::mv(results))
      .catch_([deadline](kj::Exception&& e) -> kj::Promise<std::string> {
        if (e.getType() == kj::Exception::Type::OVERLOADED &&
            e.getDescription().startsWith("operation timed out")) {
          return makeError(ErrorCode::DEADLINE_EXCEEDED, kj::str("no answer within ", deadline));
        }
        return kj::mv(e);
      });
}

}  // namespace troupe::cli
