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
#include <kj/vector.h>
#include <pybind11/pybind11.h>

namespace troupe::python {

// Where copyStruct() finds memory a Data value of the copy may refer to instead of a copy of it.
class DataReferences {
public:
  virtual ~DataReferences() noexcept(false) = default;
  // An orphan of `to`'s message that refers to `data`'s bytes (the message, or this, keeping
  // them), or null to copy them.
  virtual kj::Maybe<capnp::Orphan<capnp::Data>> refer(capnp::Data::Reader data,
                                                      capnp::DynamicStruct::Builder to) const = 0;
};

// Python buffers a message refers to. Each is released under the GIL: at once when let go of
// on a Python thread, through withGilSoon() (runtime.h) on the loop thread. Thread-safe to
// read once filled. A copy refers to them where adoptBytes() would (the copy is a request about
// to go over an RPC connection).
class Borrowed final : public DataReferences {
public:
  class Buffer;
  // An owner of the bytes at `data` if they are one of these buffers, whole: for adoptBytes().
  kj::Maybe<kj::Array<const kj::byte>> find(capnp::Data::Reader data) const;
  // GIL held.
  void add(std::shared_ptr<Buffer> buffer) { buffers.push_back(kj::mv(buffer)); }

  kj::Maybe<capnp::Orphan<capnp::Data>> refer(capnp::Data::Reader data,
                                              capnp::DynamicStruct::Builder to) const override;

private:
  std::vector<std::shared_ptr<Buffer>> buffers;
};

// The large Data of received messages (troupe::keepReceivedBytes()) that a copy refers to,
// kept as long as this lives: a response copied for Python's threads without copying its
// tensors. Any thread, one at a time.
class KeptReceived final : public DataReferences {
public:
  kj::Maybe<capnp::Orphan<capnp::Data>> refer(capnp::Data::Reader data,
                                              capnp::DynamicStruct::Builder to) const override;

private:
  mutable kj::Vector<kj::Array<kj::byte>> kept;
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
// `results`: `target` is an actor's results, which refer only to buffers that cannot change
// (bytes, a read-only array), since the actor may change the others once its method returned;
// without `borrowed` such a buffer is referred to when `target` is the reply itself (an
// outgoing message, on the loop thread), which then keeps it.
void fillStruct(capnp::DynamicStruct::Builder target, pybind11::handle fields,
                const std::string& context, Borrowed* borrowed = nullptr, bool results = false);

// `value` as a Python object. GIL held. With `views`, a Data value of at least
// KEPT_RECEIVED_MIN_BYTES (net/bytes.h) that lies in a message troupe received
// (troupe::keepReceivedBytes()) is a writable memoryview over the message's own memory, kept alive
// by the view, instead of a copy as bytes: how a received tensor reaches NumPy without a copy.
pybind11::object toPython(capnp::DynamicValue::Reader value, bool views = false);

// A memoryview over `bytes`, which it keeps until Python lets go of it (on any thread). GIL
// held.
pybind11::object viewOf(kj::Array<const kj::byte> bytes, bool writable);

// Registers the type of the views toPython() and viewOf() make. Once, at import.
void bindValues(pybind11::module_& m);

// Copies every field set in `from` into `to` (same schema). No GIL needed. A Data value (a
// field at any depth, an element of a list, a field of a list's struct) that `references`
// refers to is not copied.
void copyStruct(capnp::DynamicStruct::Reader from, capnp::DynamicStruct::Builder to,
                const DataReferences* references = nullptr);

}  // namespace troupe::python
