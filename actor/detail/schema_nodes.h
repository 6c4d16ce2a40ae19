#pragma once
// The schema nodes an interface depends on, for clients that call it without generated code.

#include <capnp/schema.h>
#include <kj/vector.h>

namespace troupe::actor_detail {

// `root` and every node reachable from it that a dynamic caller needs: superclasses, methods'
// parameter and result structs, and the structs (groups included), enums and interfaces that
// fields and list elements use. Each node once, `root` first.
kj::Vector<capnp::Schema> schemaClosure(capnp::InterfaceSchema root);

}  // namespace troupe::actor_detail
