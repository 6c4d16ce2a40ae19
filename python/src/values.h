#pragma once
// Cap'n Proto values as Python values, through the dynamic API: structs as dicts (a union's
// active member only), lists as lists, enums by name, Text as str, Data as bytes; and back,
// from dicts, keyword arguments, sequences and any buffer for Data, checked against the schema
// with errors that name the field and the method.

#include <string>

#include <capnp/dynamic.h>
#include <pybind11/pybind11.h>

namespace troupe::python {

// Fills `target` from `fields` (a dict of field names, or None for none). GIL held. Raises
// troupe.InvalidArgument, beginning with `context` (a method's signature), for a name the
// struct lacks, a value of the wrong type or out of range, or two members of one union.
void fillStruct(capnp::DynamicStruct::Builder target, pybind11::handle fields,
                const std::string& context);

// `value` as a Python object. GIL held.
pybind11::object toPython(capnp::DynamicValue::Reader value);

// Copies every field set in `from` into `to` (same schema). No GIL needed.
void copyStruct(capnp::DynamicStruct::Reader from, capnp::DynamicStruct::Builder to);

}  // namespace troupe::python
