#include "troupe/actor/detail/schema_nodes.h"

#include <set>

namespace troupe::actor_detail {

namespace {

class Closure {
public:
  void add(capnp::Schema schema) {
    if (!seen.insert(schema.getProto().getId()).second) return;
    out.add(schema);
    auto proto = schema.getProto();
    if (proto.isInterface()) {
      auto iface = schema.asInterface();
      for (auto super : iface.getSuperclasses()) add(super);
      for (auto method : iface.getMethods()) {
        add(method.getParamType());
        add(method.getResultType());
      }
    } else if (proto.isStruct()) {
      for (auto field : schema.asStruct().getFields()) addType(field.getType());
    }
  }

  kj::Vector<capnp::Schema> out;

private:
  void addType(capnp::Type type) {
    while (type.isList()) type = type.asList().getElementType();
    if (type.isStruct()) {
      add(type.asStruct());
    } else if (type.isEnum()) {
      add(type.asEnum());
    } else if (type.isInterface()) {
      add(type.asInterface());
    }
  }

  std::set<uint64_t> seen;
};

}  // namespace

kj::Vector<capnp::Schema> schemaClosure(capnp::InterfaceSchema root) {
  Closure closure;
  closure.add(root);
  return kj::mv(closure.out);
}

}  // namespace troupe::actor_detail
