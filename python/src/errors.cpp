#include "python/src/errors.h"

namespace py = pybind11;

namespace troupe::python {

namespace {

// Filled once at import, read with the GIL held; never freed (the interpreter may finalize
// after this library's statics).
py::dict* classes = nullptr;

py::object classFor(kj::StringPtr name) {
  if (classes == nullptr) return py::reinterpret_borrow<py::object>(PyExc_RuntimeError);
  auto key = py::str(name.cStr());
  if (classes->contains(key)) return (*classes)[key];
  return (*classes)[py::str("failed")];
}

py::object make(py::object cls, const std::string& message, kj::StringPtr code,
                const std::string& endpoint, bool mayHaveRun) {
  using namespace py::literals;
  py::object where = endpoint.empty() ? py::none() : py::object(py::str(endpoint));
  return cls(py::str(message), "code"_a = py::str(code.cStr()), "endpoint"_a = where,
             "may_have_run"_a = mayHaveRun);
}

}  // namespace

void setErrorClasses(py::dict c) {
  if (classes == nullptr) classes = new py::dict();
  *classes = c;
}

py::object errorObject(const kj::Exception& e, const std::string& endpoint) {
  auto code = errorCode(e);
  auto name = errorCodeName(code);
  bool byActor = raisedByActor(e);
  auto cls = byActor ? classFor("actor_error") : classFor(name);
  std::string message(errorMessage(e).cStr());
  return make(cls, message, name, endpoint, !callNeverRan(code));
}

void setError(const kj::Exception& e, const std::string& endpoint) {
  auto error = errorObject(e, endpoint);
  PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(error.ptr())), error.ptr());
}

void raise(const kj::Exception& e, const std::string& endpoint) {
  setError(e, endpoint);
  throw py::error_already_set();
}

void raiseInvalidArgument(const std::string& message) {
  auto error = make(classFor("invalid_argument"), message, "invalid_argument", {}, false);
  PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(error.ptr())), error.ptr());
  throw py::error_already_set();
}

}  // namespace troupe::python
