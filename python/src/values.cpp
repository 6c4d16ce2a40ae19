#include "python/src/values.h"

#include <cmath>
#include <limits>

#include <capnp/schema.h>
#include <kj/debug.h>

#include "troupe/actor/dynamic_actor.h"
#include "troupe/net/bytes.h"
#include "python/src/errors.h"
#include "python/src/runtime.h"

namespace py = pybind11;

namespace troupe::python {

namespace {

using capnp::schema::Type;

// Where a value goes, for errors: the method, and the path to the field ("point.x",
// "values[3]").
// And what keeps the buffers the message refers to, if it may; whether they are an actor's
// results (referred to only when they cannot change).
struct Where {
  const std::string& context;
  std::string path;
  Borrowed* borrowed;
  bool results;

  Where field(kj::StringPtr name) const {
    return {context, path.empty() ? std::string(name.cStr()) : path + "." + name.cStr(), borrowed,
            results};
  }
  Where element(size_t i) const {
    return {context, path + "[" + std::to_string(i) + "]", borrowed, results};
  }

  [[noreturn]] void fail(const std::string& what) const {
    raiseInvalidArgument(context + ": '" + path + "' " + what);
  }
};

std::string pyTypeName(py::handle value) { return Py_TYPE(value.ptr())->tp_name; }

[[noreturn]] void wrongType(const Where& where, capnp::Type type, py::handle value) {
  where.fail("must be " + capnpTypeName(type) + ", got " + pyTypeName(value));
}

bool isInt(py::handle v) { return PyLong_Check(v.ptr()) && !PyBool_Check(v.ptr()); }

int64_t signedIn(py::handle v, int64_t min, int64_t max, const Where& where, capnp::Type type) {
  if (!isInt(v)) wrongType(where, type, v);
  int overflow = 0;
  long long x = PyLong_AsLongLongAndOverflow(v.ptr(), &overflow);
  if (overflow != 0 || x < min || x > max) {
    where.fail("is out of range for " + capnpTypeName(type) + ": " +
               py::str(v).cast<std::string>());
  }
  return x;
}

uint64_t unsignedIn(py::handle v, uint64_t max, const Where& where, capnp::Type type) {
  if (!isInt(v)) wrongType(where, type, v);
  unsigned long long x = PyLong_AsUnsignedLongLong(v.ptr());
  if (PyErr_Occurred() != nullptr || x > max) {
    PyErr_Clear();
    where.fail("is out of range for " + capnpTypeName(type) + ": " +
               py::str(v).cast<std::string>());
  }
  return x;
}

// A buffer's bytes, exported while this lives (GIL held).
class Bytes {
public:
  Bytes(py::handle v, const Where& where, capnp::Type type) {
    if (!PyObject_CheckBuffer(v.ptr()) || PyUnicode_Check(v.ptr())) wrongType(where, type, v);
    if (PyObject_GetBuffer(v.ptr(), &view, PyBUF_C_CONTIGUOUS) != 0) {
      PyErr_Clear();
      where.fail("must be a contiguous buffer (bytes, bytearray, memoryview, array)");
    }
  }
  ~Bytes() {
    if (exported) PyBuffer_Release(&view);
  }
  KJ_DISALLOW_COPY(Bytes);
  capnp::Data::Reader data() const {
    return {static_cast<const kj::byte*>(view.buf), static_cast<size_t>(view.len)};
  }
  // Whether its owner lets no one change it (bytes, a read-only array).
  bool readonly() const { return view.readonly != 0; }
  // The export, from now on the caller's to release.
  Py_buffer release() {
    exported = false;
    return view;
  }

private:
  Py_buffer view;
  bool exported = true;
};

// Buffers this small are copied: referring to one costs more than copying it.
constexpr size_t MIN_BORROWED_BYTES = 1024;

bool borrowable(capnp::Data::Reader data) {
  return data.size() >= MIN_BORROWED_BYTES && data.size() % sizeof(capnp::word) == 0 &&
         reinterpret_cast<uintptr_t>(data.begin()) % sizeof(capnp::word) == 0;
}

capnp::Text::Reader textOf(py::handle v, const Where& where, capnp::Type type) {
  if (!PyUnicode_Check(v.ptr())) wrongType(where, type, v);
  Py_ssize_t size = 0;
  const char* utf8 = PyUnicode_AsUTF8AndSize(v.ptr(), &size);
  if (utf8 == nullptr) {
    PyErr_Clear();
    where.fail("is not valid text (it must encode as UTF-8)");
  }
  return {utf8, static_cast<size_t>(size)};
}

capnp::DynamicEnum enumOf(py::handle v, const Where& where, capnp::Type type) {
  auto schema = type.asEnum();
  if (PyUnicode_Check(v.ptr())) {
    auto name = v.cast<std::string>();
    KJ_IF_MAYBE(e, schema.findEnumerantByName(name.c_str())) {
      return capnp::DynamicEnum(*e);
    }
    std::string names;
    for (auto e : schema.getEnumerants()) {
      names += (names.empty() ? "" : ", ") + std::string(e.getProto().getName().cStr());
    }
    where.fail("has no enumerant '" + name + "' in " + capnpTypeName(type) + " (" + names + ")");
  }
  if (isInt(v)) return capnp::DynamicEnum(schema, signedIn(v, 0, 65535, where, type));
  wrongType(where, type, v);
}

// Calls `set` with `v` as a value of scalar (non-struct, non-list) `type`.
template <typename Set>
void withScalar(capnp::Type type, py::handle v, const Where& where, Set&& set) {
  switch (type.which()) {
    case Type::VOID:
      if (!v.is_none()) wrongType(where, type, v);
      return set(capnp::VOID);
    case Type::BOOL:
      if (!PyBool_Check(v.ptr())) wrongType(where, type, v);
      return set(v.ptr() == Py_True);
    case Type::INT8:
      return set(signedIn(v, INT8_MIN, INT8_MAX, where, type));
    case Type::INT16:
      return set(signedIn(v, INT16_MIN, INT16_MAX, where, type));
    case Type::INT32:
      return set(signedIn(v, INT32_MIN, INT32_MAX, where, type));
    case Type::INT64:
      return set(signedIn(v, INT64_MIN, INT64_MAX, where, type));
    case Type::UINT8:
      return set(unsignedIn(v, UINT8_MAX, where, type));
    case Type::UINT16:
      return set(unsignedIn(v, UINT16_MAX, where, type));
    case Type::UINT32:
      return set(unsignedIn(v, UINT32_MAX, where, type));
    case Type::UINT64:
      return set(unsignedIn(v, UINT64_MAX, where, type));
    case Type::FLOAT32:
    case Type::FLOAT64: {
      if (!PyFloat_Check(v.ptr()) && !isInt(v)) wrongType(where, type, v);
      double x = PyFloat_AsDouble(v.ptr());
      bool tooLarge = x == -1.0 && PyErr_Occurred() != nullptr;  // an int past any double
      PyErr_Clear();
      if (type.which() == Type::FLOAT32 && std::isfinite(x)) {
        tooLarge = tooLarge || std::fabs(x) > std::numeric_limits<float>::max();
      }
      if (tooLarge) {
        where.fail("is out of range for " + capnpTypeName(type) + ": " +
                   py::str(v).cast<std::string>());
      }
      return set(x);
    }
    case Type::TEXT:
      return set(textOf(v, where, type));
    case Type::DATA: {
      Bytes bytes(v, where, type);
      return set(bytes.data());
    }
    case Type::ENUM:
      return set(enumOf(v, where, type));
    case Type::INTERFACE:
    case Type::ANY_POINTER:
      where.fail("is of type " + capnpTypeName(type) + ", which cannot be sent from Python");
    case Type::STRUCT:
    case Type::LIST:
      break;
  }
  KJ_UNREACHABLE;
}

void fillList(capnp::DynamicList::Builder list, py::handle items, const Where& where);

// Sets Data field `f` of `s` (or element `i` of `list`) to `data`. DynamicStruct's own adopt()
// reads what it adopts through a Builder, which data from referenceExternalData() refuses to
// give (it is const): these adopt through the pointer itself.
void adoptData(capnp::DynamicStruct::Builder s, capnp::StructSchema::Field f,
               capnp::Orphan<capnp::Data>&& data) {
  s.set(f, capnp::Data::Reader());  // selects `f` when it is a union's member
  auto slot = f.getProto().getSlot().getOffset();
  capnp::AnyStruct::Builder(s).getPointerSection()[slot].adopt(kj::mv(data));
}
void adoptData(capnp::DynamicList::Builder list, uint i, capnp::Orphan<capnp::Data>&& data) {
  list.as<capnp::List<capnp::Data>>().adopt(i, kj::mv(data));
}

capnp::Orphan<capnp::Data> dataOrphan(capnp::Orphanage orphanage, Bytes& bytes, const Where& where,
                                      const void* address = nullptr);

bool isSequence(py::handle v) {
  return (PyList_Check(v.ptr()) || PyTuple_Check(v.ptr()) ||
          (PySequence_Check(v.ptr()) && !PyUnicode_Check(v.ptr()) && !PyBytes_Check(v.ptr()) &&
           !PyByteArray_Check(v.ptr()) && !PyMemoryView_Check(v.ptr()) && !PyDict_Check(v.ptr())));
}

void fillFields(capnp::DynamicStruct::Builder target, py::handle fields, const Where& where);

void setField(capnp::DynamicStruct::Builder s, capnp::StructSchema::Field f, py::handle v,
              const Where& where) {
  auto type = f.getType();
  if (f.getProto().isGroup()) {
    return fillFields(s.init(f).as<capnp::DynamicStruct>(), v, where);
  }
  switch (type.which()) {
    case Type::STRUCT:
      return fillFields(s.init(f).as<capnp::DynamicStruct>(), v, where);
    case Type::LIST: {
      if (!isSequence(v)) wrongType(where, type, v);
      auto size = py::len(v);
      return fillList(s.init(f, size).as<capnp::DynamicList>(), v, where);
    }
    case Type::DATA: {
      Bytes bytes(v, where, type);
      const void* address = capnp::AnyStruct::Builder(s).getDataSection().begin();
      return adoptData(
          s, f, dataOrphan(capnp::Orphanage::getForMessageContaining(s), bytes, where, address));
    }
    default:
      return withScalar(type, v, where, [&](capnp::DynamicValue::Reader r) { s.set(f, r); });
  }
}

void fillList(capnp::DynamicList::Builder list, py::handle items, const Where& where) {
  auto type = list.getSchema().getElementType();
  auto sequence = py::reinterpret_borrow<py::sequence>(items);
  for (uint i = 0; i < list.size(); ++i) {
    py::object item = sequence[i];
    auto at = where.element(i);
    switch (type.which()) {
      case Type::STRUCT:
        fillFields(list[i].as<capnp::DynamicStruct>(), item, at);
        break;
      case Type::LIST: {
        if (!isSequence(item)) wrongType(at, type, item);
        auto size = py::len(item);
        fillList(list.init(i, size).as<capnp::DynamicList>(), item, at);
        break;
      }
      case Type::DATA: {
        Bytes bytes(item, at, type);
        adoptData(list, i, dataOrphan(capnp::Orphanage::getForMessageContaining(list), bytes, at));
        break;
      }
      default:
        withScalar(type, item, at, [&](capnp::DynamicValue::Reader r) { list.set(i, r); });
    }
  }
}

void fillFields(capnp::DynamicStruct::Builder target, py::handle fields, const Where& where) {
  if (fields.is_none()) return;
  if (!PyDict_Check(fields.ptr())) {
    if (where.path.empty()) {
      raiseInvalidArgument(where.context + ": parameters must be a dict, got " +
                           pyTypeName(fields));
    }
    wrongType(where, capnp::Type(target.getSchema()), fields);
  }
  auto schema = target.getSchema();
  kj::Maybe<capnp::StructSchema::Field> unionMember;
  for (auto item : py::reinterpret_borrow<py::dict>(fields)) {
    if (!PyUnicode_Check(item.first.ptr())) {
      raiseInvalidArgument(where.context + ": field names must be str, got " +
                           pyTypeName(item.first));
    }
    auto name = item.first.cast<std::string>();
    auto at = where.field(name.c_str());
    KJ_IF_MAYBE(f, schema.findFieldByName(name.c_str())) {
      if (f->getProto().getDiscriminantValue() != capnp::schema::Field::NO_DISCRIMINANT) {
        KJ_IF_MAYBE(other, unionMember) {
          at.fail(std::string("and '") + other->getProto().getName().cStr() +
                  "' are members of one union: give one");
        }
        unionMember = *f;
      }
      setField(target, *f, item.second, at);
    } else {
      std::string names;
      for (auto field : schema.getFields()) {
        names += (names.empty() ? "" : ", ") + std::string(field.getProto().getName().cStr());
      }
      if (where.path.empty()) {
        raiseInvalidArgument(where.context + ": no parameter '" + name +
                             "' (its parameters: " + (names.empty() ? "none" : names) + ")");
      }
      at.fail("is not a field of " + std::string(schema.getShortDisplayName().cStr()) + " (" +
              (names.empty() ? "none" : names) + ")");
    }
  }
}

}  // namespace

// One exported buffer. Released under the GIL where it is let go of (a Python thread holds it;
// a hosted actor's serving thread, host.h, takes it), soon on the client loop's thread, which
// must not wait for it.
class Borrowed::Buffer {
public:
  explicit Buffer(Py_buffer exported) : view(kj::heap<Py_buffer>(exported)) {}
  ~Buffer() noexcept {
    withGil([view = kj::mv(view)]() mutable { PyBuffer_Release(view.get()); });
  }
  KJ_DISALLOW_COPY(Buffer);
  capnp::Data::Reader data() const {
    return {static_cast<const kj::byte*>(view->buf), static_cast<size_t>(view->len)};
  }

private:
  kj::Own<Py_buffer> view;
};

kj::Maybe<kj::Array<const kj::byte>> Borrowed::find(capnp::Data::Reader data) const {
  for (auto& b : buffers) {
    auto bytes = b->data();
    if (bytes.begin() == data.begin() && bytes.size() == data.size()) {
      return kj::ArrayPtr<const kj::byte>(bytes).attach(std::shared_ptr<Buffer>(b));
    }
  }
  return nullptr;
}

kj::Array<const kj::byte> borrowBuffer(py::handle buffer, const std::string& what) {
  Py_buffer view;
  if (PyObject_GetBuffer(buffer.ptr(), &view, PyBUF_C_CONTIGUOUS) != 0) {
    PyErr_Clear();
    raiseInvalidArgument(what +
                         " must be a contiguous buffer (bytes, bytearray, memoryview, "
                         "a NumPy array), not " +
                         py::str(py::type::of(buffer).attr("__name__")).cast<std::string>());
  }
  auto owner = std::make_shared<Borrowed::Buffer>(view);
  auto bytes = owner->data();
  return kj::ArrayPtr<const kj::byte>(bytes.begin(), bytes.size()).attach(kj::mv(owner));
}

namespace {

// `bytes` for a Data value in the message of `orphanage`: referred to when it may be
// (borrowable(), and `where` lets it, or the message is about to go over an RPC connection
// and holds `at`, as an actor's results do), copied otherwise.
capnp::Orphan<capnp::Data> dataOrphan(capnp::Orphanage orphanage, Bytes& bytes, const Where& where,
                                      const void* address) {
  auto data = bytes.data();
  kj::Array<const kj::byte> held;  // the buffer, once `bytes` let go of it, until it is copied
  // What an actor returns it may change once its method returned, while the reply is still
  // being written: only what cannot change is sent from its own memory.
  if (borrowable(data) && (!where.results || bytes.readonly())) {
    if (where.borrowed != nullptr) {
      auto orphan = orphanage.referenceExternalData(data);
      where.borrowed->add(std::make_shared<Borrowed::Buffer>(bytes.release()));
      return orphan;
    }
    if (where.results && address != nullptr) {
      held = kj::ArrayPtr<const kj::byte>(data).attach(
          std::make_shared<Borrowed::Buffer>(bytes.release()));
      if (attachToOutgoingMessage(address, held)) return orphanage.referenceExternalData(data);
    }
  }
  auto copy = orphanage.newOrphan<capnp::Data>(data.size());
  if (data.size() > 0) memcpy(copy.get().begin(), data.begin(), data.size());
  return copy;
}

}  // namespace

void fillStruct(capnp::DynamicStruct::Builder target, py::handle fields, const std::string& context,
                Borrowed* borrowed, bool results) {
  fillFields(target, fields, Where{context, "", borrowed, results});
}

namespace {

// Bytes troupe received (kept past their message by troupe::keepReceivedBytes(), or a blob), seen
// from Python as a buffer; what toPython()'s and viewOf()'s views are views of.
struct ReceivedBytes {
  kj::Array<const kj::byte> bytes;
  bool writable;
};

}  // namespace

void bindValues(py::module_& m) {
  py::class_<ReceivedBytes>(m, "_ReceivedBytes", py::buffer_protocol())
      .def_buffer([](ReceivedBytes& b) {
        return py::buffer_info(const_cast<kj::byte*>(b.bytes.begin()), 1,
                               py::format_descriptor<uint8_t>::format(), 1,
                               {static_cast<py::ssize_t>(b.bytes.size())}, {1}, !b.writable);
      })
      .def("__len__", [](const ReceivedBytes& b) { return b.bytes.size(); });
}

py::object viewOf(kj::Array<const kj::byte> bytes, bool writable) {
  return py::memoryview(py::cast(ReceivedBytes{kj::mv(bytes), writable}));
}

py::object toPython(capnp::DynamicValue::Reader value, bool views) {
  switch (value.getType()) {
    case capnp::DynamicValue::UNKNOWN:
    case capnp::DynamicValue::VOID:
      return py::none();
    case capnp::DynamicValue::BOOL:
      return py::bool_(value.as<bool>());
    case capnp::DynamicValue::INT:
      return py::int_(value.as<int64_t>());
    case capnp::DynamicValue::UINT:
      return py::int_(value.as<uint64_t>());
    case capnp::DynamicValue::FLOAT:
      return py::float_(value.as<double>());
    case capnp::DynamicValue::TEXT: {
      auto text = value.as<capnp::Text>();
      return py::reinterpret_steal<py::object>(
          PyUnicode_DecodeUTF8(text.begin(), static_cast<Py_ssize_t>(text.size()), "replace"));
    }
    case capnp::DynamicValue::DATA: {
      auto data = value.as<capnp::Data>();
      if (views && data.size() >= KEPT_RECEIVED_MIN_BYTES) {
        KJ_IF_MAYBE(kept, keepReceivedBytes(data)) {
          return viewOf(kj::mv(*kept), true);
        }
      }
      return py::bytes(reinterpret_cast<const char*>(data.begin()), data.size());
    }
    case capnp::DynamicValue::LIST: {
      auto list = value.as<capnp::DynamicList>();
      py::list out(list.size());
      for (uint i = 0; i < list.size(); ++i) out[i] = toPython(list[i], views);
      return out;
    }
    case capnp::DynamicValue::ENUM: {
      auto e = value.as<capnp::DynamicEnum>();
      KJ_IF_MAYBE(known, e.getEnumerant()) {
        return py::str(known->getProto().getName().cStr());
      }
      return py::int_(e.getRaw());
    }
    case capnp::DynamicValue::STRUCT: {
      auto s = value.as<capnp::DynamicStruct>();
      py::dict out;
      for (auto f : s.getSchema().getNonUnionFields()) {
        out[py::str(f.getProto().getName().cStr())] = toPython(s.get(f), views);
      }
      KJ_IF_MAYBE(f, s.which()) {
        out[py::str(f->getProto().getName().cStr())] = toPython(s.get(*f), views);
      }
      return out;
    }
    case capnp::DynamicValue::CAPABILITY:
    case capnp::DynamicValue::ANY_POINTER:
      return py::none();
  }
  return py::none();
}

namespace {

// Copies field `f` of `from` into `to`, referring to what `references` has of its Data.
void copyField(capnp::DynamicStruct::Reader from, capnp::DynamicStruct::Builder to,
               capnp::StructSchema::Field f, const DataReferences& references) {
  auto type = f.getType();
  if (type.isData()) {
    KJ_IF_MAYBE(orphan, references.refer(from.get(f).as<capnp::Data>(), to)) {
      return adoptData(to, f, kj::mv(*orphan));
    }
  } else if (type.isStruct()) {
    return copyStruct(from.get(f).as<capnp::DynamicStruct>(), to.init(f).as<capnp::DynamicStruct>(),
                      &references);
  } else if (type.isList() && type.asList().getElementType().isData()) {
    auto items = from.get(f).as<capnp::DynamicList>();
    auto list = to.init(f, items.size()).as<capnp::DynamicList>();
    for (uint i = 0; i < items.size(); ++i) {
      auto item = items[i].as<capnp::Data>();
      KJ_IF_MAYBE(orphan, references.refer(item, to)) {
        adoptData(list, i, kj::mv(*orphan));
      } else {
        list.set(i, item);
      }
    }
    return;
  } else if (type.isList() && type.asList().getElementType().isStruct()) {
    auto items = from.get(f).as<capnp::DynamicList>();
    auto list = to.init(f, items.size()).as<capnp::DynamicList>();
    for (uint i = 0; i < items.size(); ++i) {
      copyStruct(items[i].as<capnp::DynamicStruct>(), list[i].as<capnp::DynamicStruct>(),
                 &references);
    }
    return;
  }
  to.set(f, from.get(f));
}

}  // namespace

kj::Maybe<capnp::Orphan<capnp::Data>> Borrowed::refer(capnp::Data::Reader data,
                                                      capnp::DynamicStruct::Builder to) const {
  KJ_IF_MAYBE(owner, find(data)) {
    // The struct's own location tells which message it is in (as in adoptBytes()).
    const void* at = capnp::AnyStruct::Builder(to).getDataSection().begin();
    if (attachToOutgoingMessage(at, *owner)) {
      return capnp::Orphanage::getForMessageContaining(to).referenceExternalData(data);
    }
  }
  return nullptr;
}

kj::Maybe<capnp::Orphan<capnp::Data>> KeptReceived::refer(capnp::Data::Reader data,
                                                          capnp::DynamicStruct::Builder to) const {
  if (data.size() < KEPT_RECEIVED_MIN_BYTES) return nullptr;
  KJ_IF_MAYBE(bytes, keepReceivedBytes(data)) {
    kept.add(kj::mv(*bytes));
    return capnp::Orphanage::getForMessageContaining(to).referenceExternalData(data);
  }
  return nullptr;
}

void copyStruct(capnp::DynamicStruct::Reader from, capnp::DynamicStruct::Builder to,
                const DataReferences* references) {
  auto copy = [&](capnp::StructSchema::Field f) {
    if (f.getProto().isGroup()) {
      copyStruct(from.get(f).as<capnp::DynamicStruct>(), to.init(f).as<capnp::DynamicStruct>(),
                 references);
    } else if (from.has(f)) {
      if (references != nullptr) {
        copyField(from, to, f, *references);
      } else {
        to.set(f, from.get(f));
      }
    }
  };
  for (auto f : from.getSchema().getNonUnionFields()) copy(f);
  KJ_IF_MAYBE(f, from.which()) {
    // The active member, even at its default, so that the discriminant is set.
    if (f->getProto().isGroup() || from.has(*f)) {
      copy(*f);
    } else {
      to.set(*f, from.get(*f));
    }
  }
}

}  // namespace troupe::python
