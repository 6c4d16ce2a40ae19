#pragma once
// Cap'n Proto values as Python values, through the dynamic API: structs as dicts (a union's
// active member only), lists as lists, enums by name, Text as str, Data as bytes; and back,
// from dicts, keyword arguments, sequences and any buffer for Data, checked against the schema
// with errors that name the field and the method.
//
// A large buffer given for a Data field goes out without a copy (troupe::adoptBytes, bytes.h):
// fillStruct() has the parameters refer to it, and copyStruct() has each request refer to it
// in turn, so that the RPC connection writes it from the buffer itself. It stays exported (a
// bytearray cannot be resized, say) until every message referring to it is gone; it must not
// change until the call returns.

#include <memory>
#include <string>
#include <vector>

#include <capnp/dynamic.h>
#include <kj/array.h>
#include <pybind11/pybind11.h>

namespace troupe::python {

// Python buffers a message refers to. Each is released under the GIL: at once when let go of
// on a Python thread, through withGilSoon() (runtime.h) on the loop thread. Thread-safe to
// read once filled.
class Borrowed {
public:
  class Buffer;
  // An owner of the bytes at `data` if they are one of these buffers, whole: for adoptBytes().
  kj::Maybe<kj::Array<const kj::byte>> find(capnp::Data::Reader data) const;
  // GIL held.
  void add(std::shared_ptr<Buffer> buffer) { buffers.push_back(kj::mv(buffer)); }

private:
  std::vector<std::shared_ptr<Buffer>> buffers;
};

// `buffer`'s bytes (any contiguous Python buffer: bytes, bytearray, memoryview, a NumPy array),
// exported until the returned array is dropped (on any thread; the export is released under the
// GIL, as Borrowed's are). GIL held. Raises InvalidArgument, naming `what`, for anything else.
kj::Array<const kj::byte> borrowBuffer(pybind11::handle buffer, const std::string& what);

// Fills `target` from `fields` (a dict of field names, or None for none). GIL held. Raises
// troupe.InvalidArgument, beginning with `context` (a method's signature), for a name the
// struct lacks, a value of the wrong type or out of range, or two members of one union. With
// `borrowed`, a Data value (a field at any depth, or an element of a list) given a buffer of at
// least 1 KiB that starts on an 8-byte boundary and is a whole number of 8-byte words refers
// to it instead of copying it, and `borrowed` keeps it: `borrowed` must outlive the message.
void fillStruct(capnp::DynamicStruct::Builder target, pybind11::handle fields,
                const std::string& context, Borrowed* borrowed = nullptr);

// `value` as a Python object. GIL held.
pybind11::object toPython(capnp::DynamicValue::Reader value);

// Copies every field set in `from` into `to` (same schema). No GIL needed. A Data field that
// refers to one of `borrowed`'s buffers is adopted by `to` without a copy where adoptBytes()
// can (`to` is a request about to go over an RPC connection), and copied otherwise.
void copyStruct(capnp::DynamicStruct::Reader from, capnp::DynamicStruct::Builder to,
                const Borrowed* borrowed = nullptr);

}  // namespace troupe::python
