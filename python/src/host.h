#pragma once
// Python objects served as troupe actors: troupe.serve(schema, interface, obj, name=...).

#include <string>
#include <vector>

#include <pybind11/pybind11.h>

namespace troupe::python {

struct ServeOptions {
  std::string name;                     // the actor's name ("calc"): endpoint <job>/<name>-<i>
  std::string listen;                   // "" for the server's default address
  uint32_t maxConcurrency = 1;          // calls at once (0: no limit); other than 1: on workers
  std::vector<std::string> importPath;  // for the schema's imports, before /usr/include
};

// Parses `schemaPath`, finds `interfaceName` in it, and serves `impl` as that interface in a
// replica of the job the environment names (TROUPE_JOB_ID, TROUPE_RESOLVER, ...), exactly as
// hostActor() serves a C++ actor: published, listed with its schema, drained on SIGTERM or
// SIGINT. Blocks the calling thread, which runs an event loop of its own meanwhile and calls
// `impl`'s methods with the GIL held; returns once the replica stopped. Raises InvalidArgument
// for a bad schema, interface or name, and what starting the replica failed with.
void serve(const std::string& schemaPath, const std::string& interfaceName, pybind11::object impl,
           const ServeOptions& options);

// Raises InvalidArgument unless `name` is a valid actor name.
void validateActorNameOrRaise(const std::string& name);

}  // namespace troupe::python
