#include "python/src/values.h"

#include <limits>

#include <capnp/schema.h>
#include <kj/debug.h>

#include "python/src/errors.h"
#include "troupe/actor/dynamic_actor.h"

namespace py = pybind11;

namespace troupe::python {

namespace {

using capnp::schema::Type;

// Where a value goes, for errors: the method, and the path to the field ("point.x",
// "values[3]").
struct Where {
  const std::string& context;
  std::string path;

  Where field(kj::StringPtr name) const {
    return {context, path.empty() ? std::string(name.cStr()) : path + "." + name.cStr()};
  }
  Where element(size_t i) const { return {context, path + "[" + std::to_string(i) + "]"}; }

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
    where.fail("is out of range for " + capnpTypeName(type) + ": " + py::str(v).cast<std::string>());
  }
  return x;
}

uint64_t unsignedIn(py::handle v, uint64_t max, const Where& where, capnp::Type type) {
  if (!isInt(v)) wrongType(where, type, v);
  unsigned long long x = PyLong_AsUnsignedLongLong(v.ptr());
  if (PyErr_Occurred() != nullptr || x > max) {
    PyErr_Clear();
    where.fail("is out of range for " + capnpTypeName(type) + ": " + py::str(v).cast<std::string>());
  }
  return x;
}

// A buffer's bytes, held while set.
class Bytes {
public:
  Bytes(py::handle v, const Where& where, capnp::Type type) {
    if (!PyObject_CheckBuffer(v.ptr()) || PyUnicode_Check(v.ptr())) wrongType(where, type, v);
    if (PyObject_GetBuffer(v.ptr(), &view, PyBUF_C_CONTIGUOUS) != 0) {
      PyErr_Clear();
      where.fail("must be a contiguous buffer (bytes, bytearray, memoryview, array)");
    }
  }
  ~Bytes() { PyBuffer_Release(&view); }
  KJ_DISALLOW_COPY(Bytes);
  capnp::Data::Reader data() const {
    return {static_cast<const kj::byte*>(view.buf), static_cast<size_t>(view.len)};
  }

private:
  Py_buffer view;
};

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
    case Type::INT8: return set(signedIn(v, INT8_MIN, INT8_MAX, where, type));
    case Type::INT16: return set(signedIn(v, INT16_MIN, INT16_MAX, where, type));
    case Type::INT32: return set(signedIn(v, INT32_MIN, INT32_MAX, where, type));
    case Type::INT64: return set(signedIn(v, INT64_MIN, INT64_MAX, where, type));
    case Type::UINT8: return set(unsignedIn(v, UINT8_MAX, where, type));
    case Type::UINT16: return set(unsignedIn(v, UINT16_MAX, where, type));
    case Type::UINT32: return set(unsignedIn(v, UINT32_MAX, where, type));
    case Type::UINT64: return set(unsignedIn(v, UINT64_MAX, where, type));
    case Type::FLOAT32:
    case Type::FLOAT64:
      if (!PyFloat_Check(v.ptr()) && !isInt(v)) wrongType(where, type, v);
      return set(PyFloat_AsDouble(v.ptr()));
    case Type::TEXT: return set(textOf(v, where, type));
    case Type::DATA: {
      Bytes bytes(v, where, type);
      return set(bytes.data());
    }
    case Type::ENUM: return set(enumOf(v, where, type));
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

bool isSequence(py::handle v) {
  return (PyList_Check(v.ptr()) || PyTuple_Check(v.ptr()) ||
          (PySequence_Check(v.ptr()) && !PyUnicode_Check(v.ptr()) && !PyBytes_Check(v.ptr()) &&
           !PyByteArray_Check(v.ptr()) && !PyMemoryView_Check(v.ptr()) &&
           !PyDict_Check(v.ptr())));
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
        raiseInvalidArgument(where.context + ": no parameter '" + name + "' (its parameters: " +
                             (names.empty() ? "none" : names) + ")");
      }
      at.fail("is not a field of " + std::string(schema.getShortDisplayName().cStr()) + " (" +
              (names.empty() ? "none" : names) + ")");
    }
  }
}

}  // namespace

void fillStruct(capnp::DynamicStruct::Builder target, py::handle fields,
                const std::string& context) {
  fillFields(target, fields, Where{context, ""});
}

py::object toPython(capnp::DynamicValue::Reader value) {
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
      return py::bytes(reinterpret_cast<const char*>(data.begin()), data.size());
    }
    case capnp::DynamicValue::LIST: {
      auto list = value.as<capnp::DynamicList>();
      py::list out(list.size());
      for (uint i = 0; i < list.size(); ++i) out[i] = toPython(list[i]);
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
        out[py::str(f.getProto().getName().cStr())] = toPython(s.get(f));
      }
      KJ_IF_MAYBE(f, s.which()) {
        out[py::str(f->getProto().getName().cStr())] = toPython(s.get(*f));
      }
      return out;
    }
    case capnp::DynamicValue::CAPABILITY:
    case capnp::DynamicValue::ANY_POINTER:
      return py::none();
  }
  return py::none();
}

void copyStruct(capnp::DynamicStruct::Reader from, capnp::DynamicStruct::Builder to) {
  auto copy = [&](capnp::StructSchema::Field f) {
    if (f.getProto().isGroup()) {
      copyStruct(from.get(f).as<capnp::DynamicStruct>(), to.init(f).as<capnp::DynamicStruct>());
    } else if (from.has(f)) {
      to.set(f, from.get(f));
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
