#pragma once
// troupe's errors (troupe/base/errors.h) as Python exceptions: the classes troupe/__init__.py
// defines (troupe.Error and one subclass per code, troupe.ActorError for what an actor raised),
// made with .code, .endpoint and .may_have_run.

#include <string>

#include <kj/exception.h>
#include <kj/string.h>
#include <pybind11/pybind11.h>

#include "troupe/base/errors.h"

namespace troupe::python {

// Takes the classes from troupe/__init__.py: `classes` maps each code's name ("may_have_run")
// to its class, and "actor_error" to the class of what actors raised.
void setErrorClasses(pybind11::dict classes);

// The Python exception for `e`; `endpoint` names the member it concerns, if known.
pybind11::object errorObject(const kj::Exception& e, const std::string& endpoint = {});

// Sets the Python error to errorObject(e, endpoint), for an exception translator.
void setError(const kj::Exception& e, const std::string& endpoint = {});

// Raises errorObject(e, endpoint) (throws pybind11::error_already_set).
[[noreturn]] void raise(const kj::Exception& e, const std::string& endpoint = {});

// Raises troupe.InvalidArgument with `message`.
[[noreturn]] void raiseInvalidArgument(const std::string& message);

}  // namespace troupe::python
