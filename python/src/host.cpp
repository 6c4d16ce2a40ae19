#include "python/src/host.h"

#include <optional>

#include <capnp/dynamic.h>
#include <capnp/schema-parser.h>
#include <kj/debug.h>
#include <kj/filesystem.h>

#include "troupe/actor/actor_server.h"
#include "troupe/actor/endpoint.h"
#include "troupe/actor/job_context.h"
#include "troupe/base/errors.h"
#include "troupe/resolver/host_actor.h"
#include "python/src/errors.h"
#include "python/src/values.h"

namespace py = pybind11;

namespace troupe::python {

namespace {

// "TypeError: add() missing 1 required positional argument: 'b'".
kj::String describePythonError(py::error_already_set& e) {
  std::string type = py::str(e.type().attr("__name__"));
  std::string message = py::str(e.value());
  return kj::str(type.c_str(), ": ", message.c_str());
}

// Python objects that must be let go of with the GIL held, on whatever thread drops them.
struct Held {
  std::optional<py::object> fn;
  std::optional<py::dict> params;
  Held() = default;
  Held(Held&&) = default;
  ~Held() {
    if (!fn && !params) return;
    py::gil_scoped_acquire gil;
    fn.reset();
    params.reset();
  }
};

// An actor whose methods are a Python object's: each call runs with the GIL, its parameters as
// keyword arguments, its return value (a dict, or None) as the results. With `onWorkers`, calls
// run on the loop's worker threads (EventLoop::offload), so that as many as the actor allows run
// at once, interleaving wherever Python lets go of the GIL (I/O, sleeps, NumPy); otherwise on
// the serving thread, one after another.
class PythonActor final : public capnp::DynamicCapability::Server {
public:
  PythonActor(EventLoop& loop, capnp::InterfaceSchema schema, py::object impl, bool onWorkers)
      : capnp::DynamicCapability::Server(schema),
        loop(loop),
        onWorkers(onWorkers),
        impl(kj::mv(impl)),
        interfaceName(kj::str(schema.getShortDisplayName())) {}

  ~PythonActor() noexcept(false) {
    py::gil_scoped_acquire gil;
    impl.reset();
  }

  kj::Promise<void> call(
      capnp::InterfaceSchema::Method method,
      capnp::CallContext<capnp::DynamicStruct, capnp::DynamicStruct> context) override {
    auto name = method.getProto().getName();
    auto where = std::string(interfaceName.cStr()) + "." + name.cStr();
    Held held;
    {
      py::gil_scoped_acquire gil;
      try {
        py::object fn = py::getattr(*impl, name.cStr(), py::none());
        if (fn.is_none()) {
          return KJ_EXCEPTION(
              UNIMPLEMENTED,
              kj::str(std::string(py::str(py::type::of(*impl).attr("__name__"))).c_str(),
                      " has no method '", name, "'"));
        }
        held.fn = kj::mv(fn);
        held.params = toPython(context.getParams());
        context.releaseParams();
        if (!onWorkers) {
          KJ_IF_MAYBE(failure, runMethod(held, context.getResults(), where)) {
            return kj::mv(*failure);
          }
          return kj::READY_NOW;
        }
      } catch (py::error_already_set& e) {
        return KJ_EXCEPTION(FAILED, describePythonError(e));
      }
    }
    // On a worker: the results go into a message of the call's own, copied in on the loop.
    struct Outcome {
      kj::Own<capnp::MallocMessageBuilder> results = kj::heap<capnp::MallocMessageBuilder>();
      kj::Maybe<kj::Exception> failure;
    };
    auto type = method.getResultType();
    return loop
        .offload([held = kj::mv(held), type, where]() mutable {
          Outcome out;
          auto root = out.results->initRoot<capnp::DynamicStruct>(type);
          py::gil_scoped_acquire gil;
          out.failure = runMethod(held, root, where);
          return out;
        })
        .then([context, type](Outcome out) mutable -> kj::Promise<void> {
          KJ_IF_MAYBE(failure, out.failure) {
            return kj::mv(*failure);
          }
          copyStruct(out.results->getRoot<capnp::DynamicStruct>(type).asReader(),
                     context.getResults());
          return kj::READY_NOW;
        });
  }

private:
  // Calls the method `held` names (`where`: "Calculator.add"), GIL held: its results go into
  // `results`; returns what it raised, or that it is a coroutine.
  static kj::Maybe<kj::Exception> runMethod(Held& held, capnp::DynamicStruct::Builder results,
                                            const std::string& where) {
    try {
      py::object result = (*held.fn)(**(*held.params));
      if (PyCoro_CheckExact(result.ptr())) {
        result.attr("close")();
        return KJ_EXCEPTION(FAILED, kj::str(where.c_str(),
                                            " is a coroutine: serve() runs plain methods only"));
      }
      if (!result.is_none()) fillStruct(results, result, where + " results");
    } catch (py::error_already_set& e) {
      return KJ_EXCEPTION(FAILED, describePythonError(e));
    }
    return nullptr;
  }

  EventLoop& loop;
  const bool onWorkers;
  std::optional<py::object> impl;  // dropped with the GIL held
  kj::String interfaceName;
};

// What a SchemaParser reads files through: it must outlive the parser (schema-parser.h).
struct SchemaFiles {
  kj::Own<kj::Filesystem> fs = kj::newDiskFilesystem();
  std::vector<kj::Own<const kj::ReadableDirectory>> dirs;
  std::vector<const kj::ReadableDirectory*> imports;
};

capnp::InterfaceSchema parseInterface(const capnp::SchemaParser& parser, SchemaFiles& files,
                                      const std::string& schemaPath,
                                      const std::string& interfaceName,
                                      const std::vector<std::string>& importPath) {
  auto& fs = files.fs;
  auto& root = fs->getRoot();
  auto absolute = fs->getCurrentPath().evalNative(schemaPath);
  auto& dirs = files.dirs;
  auto addDir = [&](kj::StringPtr dir) {
    KJ_IF_MAYBE(d, root.tryOpenSubdir(fs->getCurrentPath().evalNative(dir))) {
      dirs.push_back(kj::mv(*d));
    }
  };
  for (auto& dir : importPath) addDir(dir.c_str());
  addDir("/usr/local/include");
  addDir("/usr/include");
  auto& imports = files.imports;
  for (auto& d : dirs) imports.push_back(d.get());

  kj::Maybe<capnp::ParsedSchema> file;
  KJ_IF_MAYBE(e, kj::runCatchingExceptions([&]() {
                file = parser.parseFromDirectory(root, kj::mv(absolute),
                                                 kj::arrayPtr(imports.data(), imports.size()));
              })) {
    raiseInvalidArgument("cannot read schema '" + schemaPath + "': " + e->getDescription().cStr());
  }
  auto& parsed = KJ_ASSERT_NONNULL(file);
  KJ_IF_MAYBE(nested, parsed.findNested(interfaceName.c_str())) {
    if (nested->getProto().isInterface()) return nested->asInterface();
  }
  std::string names;
  for (auto node : parsed.getProto().getNestedNodes()) {
    names += (names.empty() ? "" : ", ") + std::string(node.getName().cStr());
  }
  raiseInvalidArgument("'" + schemaPath + "' declares no interface '" + interfaceName +
                       "' (it declares: " + (names.empty() ? "nothing" : names) + ")");
}

}  // namespace

void serve(const std::string& schemaPath, const std::string& interfaceName, py::object impl,
           const ServeOptions& options) {
  validateActorNameOrRaise(options.name);
  // The parser owns the schemas: it outlives the server.
  SchemaFiles files;  // declared first: goes after the parser
  capnp::SchemaParser parser;
  auto schema = parseInterface(parser, files, schemaPath, interfaceName, options.importPath);
  kj::Maybe<kj::Exception> failure;
  {
    py::gil_scoped_release released;
    failure = kj::runCatchingExceptions([&]() {
      EventLoop loop;
      ActorServer server(loop, JobContext::fromEnvironment());
      ActorOptions actor;
      actor.maxConcurrency = options.maxConcurrency;
      {
        py::gil_scoped_acquire gil;  // the actor holds the object
        server.hostCapability(
            options.name.c_str(), schema,
            kj::heap<PythonActor>(loop, schema, kj::mv(impl), options.maxConcurrency != 1), actor);
      }
      if (!options.listen.empty()) listenGuarded(server, options.listen.c_str());
      serveReplica(loop, server);
    });
  }
  KJ_IF_MAYBE(e, failure) {
    raise(*e);
  }
}

void validateActorNameOrRaise(const std::string& name) {
  KJ_IF_MAYBE(e, kj::runCatchingExceptions([&]() { validateActorName(name.c_str()); })) {
    raise(*e);
  }
}

}  // namespace troupe::python
