#include "troupe/actor/dynamic_actor.h"

#include <kj/debug.h>
#include <kj/vector.h>

#include "troupe/base/errors.h"

namespace troupe {

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
    out += std::string(field.getProto().getName().cStr()) + " :" + capnpTypeName(field.getType());
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
  return schemaRequest.send().then([&loader, name = std::string(name.cStr()),
                                    capability = kj::mv(capability)](auto response) mutable {
    for (auto node : response.getNodes()) loader.load(node);
    auto schema = loader.get(response.getInterfaceId()).asInterface();
    return DynamicActor{kj::mv(name), schema, kj::mv(capability)};
  });
}

std::string capnpTypeName(capnp::Type type) {
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
      return "List(" + capnpTypeName(type.asList().getElementType()) + ")";
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
  return std::string(method.getProto().getName().cStr()) + " " + fields(method.getParamType()) +
         " -> " + fields(method.getResultType());
}

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

}  // namespace troupe
