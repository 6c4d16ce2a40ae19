#include "tools/troupe/dynamic_actor.h"

#include <capnp/dynamic.h>
#include <capnp/message.h>
#include <kj/debug.h>

#include "troupe/actor/errors.h"

namespace troupe::cli {

namespace {

void collectMethods(capnp::InterfaceSchema schema, kj::Vector<kj::String>& out) {
  for (auto m : schema.getMethods()) out.add(kj::str(m.getProto().getName()));
  for (auto super : schema.getSuperclasses()) collectMethods(super, out);
}

std::string fields(capnp::StructSchema schema) {
  std::string out = "(";
  bool first = true;
  for (auto field : schema.getFields()) {
    if (!first) out += ", ";
    first = false;
    out += std::string(field.getProto().getName().cStr()) + " :" + typeName(field.getType());
  }
  return out + ")";
}

}  // namespace

kj::Promise<DynamicActor> openDynamicActor(Channel& channel, kj::StringPtr name,
                                           capnp::SchemaLoader& loader) {
  auto host = channel.host();
  auto schemaRequest = host.getSchemaRequest();
  schemaRequest.setName(name);
  auto actorRequest = host.getActorRequest();
  actorRequest.setName(name);
  auto actor = actorRequest.send();
  capnp::Capability::Client capability = actor.getActor();
  return schemaRequest.send().then(
      [&loader, name = std::string(name.cStr()), capability = kj::mv(capability)](
          auto response) mutable {
        for (auto node : response.getNodes()) loader.load(node);
        auto schema = loader.get(response.getInterfaceId()).asInterface();
        return DynamicActor{kj::mv(name), schema, kj::mv(capability)};
      });
}

std::string typeName(capnp::Type type) {
  switch (type.which()) {
    case capnp::schema::Type::VOID:
      return "Void";
    case capnp::schema::Type::BOOL:
      return "Bool";
    case capnp::schema::Type::INT8:
      return "Int8";
    case capnp::schema::Type::INT16:
      return "Int16";
    case capnp::schema::Type::INT32:
      return "Int32";
    case capnp::schema::Type::INT64:
      return "Int64";
    case capnp::schema::Type::UINT8:
      return "UInt8";
    case capnp::schema::Type::UINT16:
      return "UInt16";
    case capnp::schema::Type::UINT32:
      return "UInt32";
    case capnp::schema::Type::UINT64:
      return "UInt64";
    case capnp::schema::Type::FLOAT32:
      return "Float32";
    case capnp::schema::Type::FLOAT64:
      return "Float64";
    case capnp::schema::Type::TEXT:
      return "Text";
    case capnp::schema::Type::DATA:
      return "Data";
    case capnp::schema::Type::LIST:
      return "List(" + typeName(type.asList().getElementType()) + ")";
    case capnp::schema::Type::ENUM:
      return type.asEnum().getShortDisplayName().cStr();
    case capnp::schema::Type::STRUCT:
      return type.asStruct().getShortDisplayName().cStr();
    case capnp::schema::Type::INTERFACE:
      return type.asInterface().getShortDisplayName().cStr();
    case capnp::schema::Type::ANY_POINTER:
      return "AnyPointer";
  }
  return "?";
}

std::string describeMethod(capnp::InterfaceSchema::Method method) {
  return std::string(method.getProto().getName().cStr()) + " " +
         fields(method.getParamType()) + " -> " + fields(method.getResultType());
}

namespace {

capnp::InterfaceSchema::Method findMethod(capnp::InterfaceSchema schema, kj::StringPtr method) {
  KJ_IF_MAYBE(m, schema.findMethodByName(method)) {
    return *m;
  }
  kj::Vector<kj::String> known;
  collectMethods(schema, known);
  throwError(ErrorCode::INVALID_ARGUMENT,
             kj::str(schema.getShortDisplayName(), " has no method '", method,
                     "' (its methods: ", kj::strArray(known, ", "), ")"));
}

}  // namespace

JsonCall::JsonCall(const DynamicActor& actor, kj::StringPtr methodName, kj::StringPtr json)
    : schema(actor.schema),
      method(findMethod(actor.schema, methodName)),
      json(json.cStr()),
      label(kj::str(actor.name.c_str(), ".", methodName).cStr()) {
  // Read once here, so that bad parameters fail before any call is sent.
  capnp::MallocMessageBuilder scratch;
  codec.decodeParams(json, scratch.initRoot<capnp::DynamicStruct>(method.getParamType()),
                     label.c_str());
}

capnp::RemotePromise<capnp::DynamicStruct> JsonCall::send(
    capnp::Capability::Client capability) const {
  auto request = capability.castAs<capnp::DynamicCapability>(schema).newRequest(method);
  codec.decodeParams(json.c_str(), request, label.c_str());
  return request.send();
}

std::string JsonCall::resultsJson(capnp::DynamicStruct::Reader results) const {
  return codec.encodeResults(results).cStr();
}

kj::Promise<std::string> callWithJson(DynamicActor& actor, kj::StringPtr method,
                                      kj::StringPtr json, kj::Duration deadline,
                                      kj::Timer& timer) {
  auto call = kj::heap<JsonCall>(actor, method, json);
  auto sent = call->send(actor.capability);
  auto results = sent.then([&call = *call](capnp::Response<capnp::DynamicStruct> response) {
                       return call.resultsJson(response);
                     }).attach(kj::mv(call));
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
