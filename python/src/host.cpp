#include "python/src/host.h"

#include <signal.h>

#include <chrono>
#include <optional>

#include <capnp/dynamic.h>
#include <kj/debug.h>
#include <kj/filesystem.h>
#include <kj/mutex.h>
#include <kj/vector.h>
#include <spdlog/spdlog.h>

#include "troupe/actor/actor_server.h"
#include "troupe/actor/blob.h"
#include "troupe/actor/blob_device.h"
#include "troupe/actor/endpoint.h"
#include "troupe/actor/job_context.h"
#include "troupe/base/errors.h"
#include "troupe/resolver/host_actor.h"
#include "python/src/client.h"
#include "python/src/device.h"
#include "python/src/errors.h"
#include "python/src/logs.h"
#include "python/src/values.h"

namespace py = pybind11;

namespace troupe::python {

namespace {

// What an actor's method raised, for its caller: "<type>: <message>", then the replica's
// traceback as Python prints it ("Traceback (most recent call last):\n ..."); the type is
// qualified by its module unless it is a builtin ("ZeroDivisionError", "mymodule.Refused").
kj::String describePythonError(py::error_already_set& e) {
  py::object type = e.type();
  std::string name = py::str(type.attr("__qualname__"));
  std::string module = py::str(type.attr("__module__"));
  if (module != "builtins") name = module + "." + name;
  std::string message = py::str(e.value());
  std::string traceback;
  try {
    py::list lines =
        py::module_::import("traceback").attr("format_exception")(e.type(), e.value(), e.trace());
    for (auto line : lines) traceback += py::str(line).cast<std::string>();
  } catch (py::error_already_set&) {
    traceback = "(no traceback: formatting it failed)\n";
  }
  return kj::str(name.c_str(), ": ", message.c_str(), "\n", traceback.c_str());
}

// The exception an actor's caller gets for what its method raised (not KJ_EXCEPTION, which would
// quote the expression), logged with its traceback in the replica.
kj::Exception actorRaised(py::error_already_set& e, const std::string& where, spdlog::logger& log) {
  auto description = describePythonError(e);
  log.warn("{} raised {}", where, description.cStr());
  return kj::Exception(kj::Exception::Type::FAILED, __FILE__, __LINE__, kj::mv(description));
}

// A Python thread state for the calling thread, kept from one taking of the GIL to the next while
// this lives. Without it each taking makes a thread state and deletes it again, and a new
// thread state's first frame maps a 16 KiB stack chunk: an mmap, page faults and a munmap per
// call. GIL not held.
class KeptThreadState {
public:
  KeptThreadState() {
    py::gil_scoped_acquire gil;
    gil.inc_ref();  // outlives `gil`
  }
  ~KeptThreadState() {
    py::gil_scoped_acquire gil;
    gil.dec_ref();  // `gil` deletes it as it goes
  }
  KJ_DISALLOW_COPY(KeptThreadState);
};

// The GIL, taken on one of the loop's worker threads: their thread states are kept for the
// threads' lives (libuv's workers last until the process exits, after Python is gone, so they
// could not let go of them safely).
class WorkerGil {
public:
  WorkerGil() {
    thread_local bool kept = false;
    if (!kept) {
      gil.inc_ref();
      kept = true;
    }
  }

private:
  py::gil_scoped_acquire gil;
};

// A blob's memory, which Python may let go of on any thread while the loop still forwards from
// it (the Blob the handler gets shares a loop-only refcount).
struct BlobMemory final : public kj::AtomicRefcounted {
  explicit BlobMemory(size_t size) : bytes(allocateBlobMemory(size)) {}
  kj::Array<kj::byte> bytes;
};

// A Python object let go of with the GIL held.
struct HeldObject {
  std::optional<py::object> object;
  ~HeldObject() {
    if (!object) return;
    py::gil_scoped_acquire gil;
    object.reset();
  }
};

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
  PythonActor(EventLoop& loop, capnp::InterfaceSchema schema, py::object impl, bool onWorkers,
              bool views)
      : capnp::DynamicCapability::Server(schema),
        loop(loop),
        onWorkers(onWorkers),
        views(views),
        log(loop.logger()),
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
          std::string type = py::str(py::type::of(*impl).attr("__name__"));
          return kj::Exception(kj::Exception::Type::UNIMPLEMENTED, __FILE__, __LINE__,
                               kj::str(type.c_str(), " has no method '", name, "'"));
        }
        held.fn = kj::mv(fn);
        held.params = toPython(context.getParams(), views);
        context.releaseParams();
        if (!onWorkers) {
          KJ_IF_MAYBE(failure, runMethod(held, context.getResults(), where, *log)) {
            return kj::mv(*failure);
          }
          return kj::READY_NOW;
        }
      } catch (py::error_already_set& e) {
        return actorRaised(e, where, *log);
      }
    }
    // On a worker: the results go into a message of the call's own, copied in on the loop.
    struct Outcome {
      Borrowed borrowed;  // the buffers `results` refers to, which the reply takes over
      kj::Own<capnp::MallocMessageBuilder> results = kj::heap<capnp::MallocMessageBuilder>();
      kj::Maybe<kj::Exception> failure;
    };
    auto type = method.getResultType();
    return loop
        .offload([held = kj::mv(held), type, where, log = log]() mutable {
          Outcome out;
          auto root = out.results->initRoot<capnp::DynamicStruct>(type);
          WorkerGil gil;
          out.failure = runMethod(held, root, where, *log, &out.borrowed);
          return out;
        })
        .then([context, type](Outcome out) mutable -> kj::Promise<void> {
          KJ_IF_MAYBE(failure, out.failure) {
            return kj::mv(*failure);
          }
          copyStruct(out.results->getRoot<capnp::DynamicStruct>(type).asReader(),
                     context.getResults(), &out.borrowed);
          return kj::READY_NOW;
        });
  }

private:
  // Calls the method `held` names (`where`: "Calculator.add"), GIL held: its results go into
  // `results` (referring to large buffers it returned through `borrowed`, when given, or
  // directly when `results` is the reply itself); returns what it raised, or that it is a
  // coroutine.
  static kj::Maybe<kj::Exception> runMethod(Held& held, capnp::DynamicStruct::Builder results,
                                            const std::string& where, spdlog::logger& log,
                                            Borrowed* borrowed = nullptr) {
    try {
      py::object result = (*held.fn)(**(*held.params));
      if (PyCoro_CheckExact(result.ptr())) {
        result.attr("close")();
        return kj::Exception(kj::Exception::Type::FAILED, __FILE__, __LINE__,
                             kj::str(where.c_str(),
                                     " is a coroutine: serve() runs plain methods only (a class "
                                     "hosted with troupe.host_actor() may have async methods)"));
      }
      if (!result.is_none()) fillStruct(results, result, where + " results", borrowed, true);
    } catch (py::error_already_set& e) {
      return actorRaised(e, where, log);
    }
    return nullptr;
  }

  EventLoop& loop;
  const bool onWorkers;
  const bool views;
  std::shared_ptr<spdlog::logger> log;
  std::optional<py::object> impl;  // dropped with the GIL held
  kj::String interfaceName;
};

capnp::InterfaceSchema findInterface(capnp::ParsedSchema parsed, const std::string& schemaPath,
                                     const std::string& interfaceName) {
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

// What the files of one schema share: the directories its absolute imports are looked for in,
// each with the name the user gave it, and the errors found in any of the files. It outlives the
// parser (schema-parser.h).
struct SchemaContext {
  kj::Vector<const kj::ReadableDirectory*> importDirs;
  kj::Vector<kj::String> importNames;  // without a trailing '/'
  // Each as "<path>:<line>:<column>: <message>", 1-based. Guarded: the parser may compile lazily
  // on whichever thread uses a schema.
  kj::MutexGuarded<kj::Vector<kj::String>> errors;
};

// A schema file that adds its errors to the context's rather than failing at the first, named as
// the user named it (`name`; getDisplayName() is the wrapped file's, which names the schema's
// types), and wraps the files it imports alike. Borrows the context.
class ReportingSchemaFile final : public capnp::SchemaFile {
public:
  ReportingSchemaFile(kj::Own<capnp::SchemaFile> inner, kj::String name, SchemaContext& context)
      : inner(kj::mv(inner)), name(kj::mv(name)), context(context) {}

  kj::StringPtr getDisplayName() const override { return inner->getDisplayName(); }
  kj::Array<const char> readContent() const override { return inner->readContent(); }

  kj::Maybe<kj::Own<capnp::SchemaFile>> import(kj::StringPtr target) const override {
    KJ_IF_MAYBE(file, inner->import(target)) {
      return kj::Own<capnp::SchemaFile>(
          kj::heap<ReportingSchemaFile>(kj::mv(*file), importedName(target), context));
    }
    return nullptr;
  }

  bool operator==(const capnp::SchemaFile& other) const override {
    return *inner == *kj::downcast<const ReportingSchemaFile>(other).inner;
  }
  bool operator!=(const capnp::SchemaFile& other) const override { return !operator==(other); }
  size_t hashCode() const override { return inner->hashCode(); }

  void reportError(SourcePos start, SourcePos, kj::StringPtr message) const override {
    context.errors.lockExclusive()->add(
        kj::str(name, ':', start.line + 1, ':', start.column + 1, ": ", message));
  }

private:
  // The name of the file `target` imports: the first import directory that has it for an
  // absolute import (as the wrapped file looks), else beside this file.
  kj::String importedName(kj::StringPtr target) const {
    if (target.startsWith("/")) {
      auto path = kj::Path::parse(target.slice(1));
      for (auto i : kj::indices(context.importDirs)) {
        if (context.importDirs[i]->exists(path)) return kj::str(context.importNames[i], target);
      }
      return kj::str(target);
    }
    KJ_IF_MAYBE(slash, name.findLast('/')) {
      return kj::str(name.slice(0, *slash + 1), target);
    }
    return kj::str(target);
  }

  kj::Own<capnp::SchemaFile> inner;
  kj::String name;
  SchemaContext& context;
};

}  // namespace

// What a SchemaParser reads files through: it must outlive the parser (schema-parser.h).
struct HostedActor::Files {
  kj::Own<kj::Filesystem> fs = kj::newDiskFilesystem();
  kj::Own<kj::Directory> text = kj::newInMemoryDirectory(kj::nullClock());
  std::vector<kj::Own<const kj::ReadableDirectory>> dirs;
  SchemaContext context;

  // Parses the schema `source` names, its imports found in `importPath`, then /usr/local/include
  // and /usr/include. Raises InvalidArgument with every error found in it and its imports, each
  // as "<path>:<line>:<column>: <message>", or with why it could not be read.
  capnp::ParsedSchema parse(const capnp::SchemaParser& parser, const SchemaSource& source,
                            const std::vector<std::string>& importPath) {
    for (auto& dir : importPath) addImportDir(dir.c_str());
    addImportDir("/usr/local/include");
    addImportDir("/usr/include");

    kj::Maybe<capnp::ParsedSchema> file;
    auto failure = kj::runCatchingExceptions([&]() { file = parser.parseFile(open(source)); });
    auto errors = kj::strArray(*context.errors.lockExclusive(), "\n");
    if (errors.size() > 0) raiseInvalidArgument(errors.cStr());
    KJ_IF_MAYBE(e, failure) {
      raiseInvalidArgument("cannot read schema '" + source.path +
                           "': " + e->getDescription().cStr());
    }
    return KJ_ASSERT_NONNULL(file);
  }

private:
  void addImportDir(kj::StringPtr dir) {
    KJ_IF_MAYBE(d, fs->getRoot().tryOpenSubdir(fs->getCurrentPath().evalNative(dir))) {
      context.importDirs.add(d->get());
      dirs.push_back(kj::mv(*d));
      size_t length = dir.size();
      while (length > 0 && dir[length - 1] == '/') --length;
      context.importNames.add(kj::heapString(dir.begin(), length));
    }
  }

  // The file `source` names (on disk, or its text), reporting its errors to `context`.
  kj::Own<capnp::SchemaFile> open(const SchemaSource& source) {
    auto importDirs = context.importDirs.asPtr();
    kj::Own<capnp::SchemaFile> file;
    if (source.text.empty()) {
      file = capnp::SchemaFile::newFromDirectory(
          fs->getRoot(), fs->getCurrentPath().evalNative(source.path), importDirs);
    } else {
      auto path = kj::Path::parse(source.path);
      text->openFile(path, kj::WriteMode::CREATE | kj::WriteMode::CREATE_PARENT)
          ->writeAll(source.text);
      file = capnp::SchemaFile::newFromDirectory(*text, kj::mv(path), importDirs);
    }
    return kj::heap<ReportingSchemaFile>(kj::mv(file), kj::str(source.path.c_str()), context);
  }
};

HostedActor::HostedActor(const SchemaSource& source, const std::string& interfaceName,
                         py::object impl, ServeOptions options)
    : options(kj::mv(options)), files(kj::heap<Files>()) {
  validateActorNameOrRaise(this->options.name);
  schema = findInterface(files->parse(parser, source, this->options.importPath), source.path,
                         interfaceName);
  this->impl = kj::mv(impl);
  thread = kj::heap<kj::Thread>([this]() { run(); });
  py::gil_scoped_release released;  // the serving thread takes the object with the GIL
  std::unique_lock<std::mutex> lock(mutex);
  changed.wait(lock, [this]() { return phase != Phase::STARTING; });
  if (phase == Phase::STOPPED) {
    auto e = KJ_ASSERT_NONNULL(failure);
    lock.unlock();
    thread = nullptr;
    py::gil_scoped_acquire gil;
    raise(e);
  }
}

HostedActor::~HostedActor() noexcept(false) {
  stop(std::nullopt);
  {
    py::gil_scoped_release released;
    thread = nullptr;  // joins: the serving thread drops the object with the GIL
  }
  impl.reset();
}

namespace {

// Hands each version of blob `name` to `taker`'s take_blob(name, version, data), `data` a
// read-only memoryview that holds the blob's memory (not the loop's Blob) while Python does.
void acceptBlob(ActorServer& server, const std::string& name, HeldObject& taker,
                std::shared_ptr<spdlog::logger> log) {
  // The latest memory given for the blob: one transfer of a name is received at a time.
  auto latest = kj::heap<kj::Maybe<kj::Own<const BlobMemory>>>();
  auto& memory = *latest;
  server.acceptBlobs(
      name.c_str(),
      [&memory](const BlobHeader& header) {
        auto made = kj::atomicRefcounted<BlobMemory>(header.size);
        auto& bytes = const_cast<kj::Array<kj::byte>&>(made->bytes);
        auto given = kj::ArrayPtr<kj::byte>(bytes).attach(kj::atomicAddRef(*made));
        memory = kj::mv(made);
        return given;
      },
      [&memory, &taker, log, latest = kj::mv(latest)](Blob received) {
        kj::Array<const kj::byte> bytes;
        KJ_IF_MAYBE(m, memory) {
          if ((*m)->bytes.begin() == received.bytes.begin()) {
            bytes = kj::ArrayPtr<const kj::byte>(received.bytes).attach(kj::atomicAddRef(**m));
          }
        }
        if (bytes == nullptr) bytes = kj::heapArray<const kj::byte>(received.bytes);
        memory = nullptr;
        auto where = "blob '" + received.name + "'";
        py::gil_scoped_acquire gil;
        try {
          (*taker.object)
              .attr("take_blob")(received.name, received.version, viewOf(kj::mv(bytes), false));
        } catch (py::error_already_set& e) {
          kj::throwFatalException(actorRaised(e, where, *log));
        }
      });
}

// acceptBlob() for a blob received into CUDA device `device`: `data` is a read-only
// troupe.DeviceArray over the device memory, which Python may hold past the loop's end.
void acceptBlobOnDevice(EventLoop& loop, ActorServer& server, const std::string& name, int device,
                        HeldObject& taker, std::shared_ptr<spdlog::logger> log) {
  BlobAcceptOptions options;
  options.device = cudaBlobDevice(loop, device);
  // The latest memory given for the blob: one transfer of a name is received at a time.
  auto latest = kj::heap<std::shared_ptr<kj::Array<kj::byte>>>();
  auto& memory = *latest;
  server.acceptBlobs(
      name.c_str(),
      [&memory, device](const BlobHeader& header) {
        memory = std::make_shared<kj::Array<kj::byte>>(allocateCudaMemory(device, header.size));
        return kj::ArrayPtr<kj::byte>(*memory).attach(std::shared_ptr(memory));
      },
      [&memory, &taker, log, device, latest = kj::mv(latest)](Blob received) {
        KJ_ASSERT(memory != nullptr && memory->begin() == received.bytes.begin(),
                  "a blob received into memory this server did not allocate");
        auto held = kj::mv(memory);
        auto bytes = kj::ArrayPtr<const kj::byte>(*held).attach(kj::mv(held));
        auto where = "blob '" + received.name + "'";
        py::gil_scoped_acquire gil;
        try {
          (*taker.object)
              .attr("take_blob")(received.name, received.version,
                                 deviceArrayOf(kj::mv(bytes), device));
        } catch (py::error_already_set& e) {
          kj::throwFatalException(actorRaised(e, where, *log));
        }
      },
      kj::mv(options));
}

}  // namespace

void HostedActor::run() {
  kj::Maybe<kj::Exception> outcome;
  {
    // This thread takes the GIL for every call. Its thread state goes before the stop is
    // reported: once it is, Python may be finalizing, and the GIL is not to be taken again.
    KeptThreadState kept;
    outcome = serveHere();
  }
  finish(kj::mv(outcome));
}

kj::Maybe<kj::Exception> HostedActor::serveHere() {
  return kj::runCatchingExceptions([&]() {
    EventLoopOptions loopOptions;
    loopOptions.logger = pythonLogger();
    EventLoop loop(kj::mv(loopOptions));
    HeldObject blobTaker;  // what takes the blobs, kept by the server's blob handlers
    ActorServer server(loop, JobContext::fromEnvironment());
    ActorOptions actor;
    actor.maxConcurrency = options.maxConcurrency;
    {
      py::gil_scoped_acquire gil;  // the actor holds the object
      auto object = kj::mv(*impl);
      impl.reset();
      if (!options.blobs.empty()) blobTaker.object = object;
      server.hostCapability(options.name.c_str(), schema,
                            kj::heap<PythonActor>(loop, schema, kj::mv(object),
                                                  options.maxConcurrency != 1, options.views),
                            actor);
    }
    for (auto& [blob, device] : options.blobs) {
      if (device < 0) {
        acceptBlob(server, blob, blobTaker, loop.logger());
      } else {
        acceptBlobOnDevice(loop, server, blob, device, blobTaker, loop.logger());
      }
    }
    if (!options.listen.empty()) listenGuarded(server, options.listen.c_str());
    auto replica = publishReplica(loop, server);
    auto stopping = kj::newPromiseAndCrossThreadFulfiller<kj::Maybe<kj::Duration>>();
    {
      std::lock_guard<std::mutex> lock(mutex);
      address_ = server.listenAddresses()[0];
      for (auto& e : server.endpoints()) endpoints_.push_back(e.name);
      stopper = kj::mv(stopping.fulfiller);
      phase = Phase::SERVING;
    }
    changed.notify_all();
    auto served = options.catchSigint ? server.serve({SIGTERM, SIGINT}) : server.serve({SIGTERM});
    auto stopped = stopping.promise.then(
        [&server](kj::Maybe<kj::Duration> grace) { return server.drain(grace); });
    served.exclusiveJoin(kj::mv(stopped)).wait(loop.waitScope());
    // The drain already removed the endpoints; dropping the publisher releases the leases.
  });
}

void HostedActor::finish(kj::Maybe<kj::Exception> outcome) {
  {
    std::lock_guard<std::mutex> lock(mutex);
    failure = kj::mv(outcome);
    stopper = nullptr;
    phase = Phase::STOPPED;
  }
  changed.notify_all();
}

void HostedActor::stop(std::optional<double> grace) {
  kj::Maybe<kj::Duration> wanted;
  if (grace) wanted = durationOf(*grace, "grace");
  std::lock_guard<std::mutex> lock(mutex);
  KJ_IF_MAYBE(s, stopper) {
    (*s)->fulfill(kj::mv(wanted));
  }
}

bool HostedActor::wait(std::optional<double> timeout) {
  using Clock = std::chrono::steady_clock;
  std::optional<Clock::time_point> until;
  if (timeout)
    until = Clock::now() +
            std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(*timeout));
  while (true) {
    {
      py::gil_scoped_release released;
      std::unique_lock<std::mutex> lock(mutex);
      // Wakes every 50 ms to let Ctrl-C through.
      auto next = Clock::now() + std::chrono::milliseconds(50);
      if (until && *until < next) next = *until;
      changed.wait_until(lock, next, [this]() { return phase == Phase::STOPPED; });
      if (phase == Phase::STOPPED) break;
    }
    runGilQueue();  // the serving thread's logs, among others
    if (PyErr_CheckSignals() != 0) throw py::error_already_set();
    if (until && Clock::now() >= *until) return false;
  }
  std::unique_lock<std::mutex> lock(mutex);
  KJ_IF_MAYBE(e, failure) {
    auto copy = *e;
    lock.unlock();
    raise(copy);
  }
  return true;
}

void serve(const SchemaSource& schema, const std::string& interfaceName, py::object impl,
           const ServeOptions& options) {
  HostedActor hosted(schema, interfaceName, kj::mv(impl), options);
  try {
    hosted.wait(std::nullopt);
  } catch (py::error_already_set&) {
    hosted.stop(std::nullopt);
    throw;
  }
}

void validateActorNameOrRaise(const std::string& name) {
  KJ_IF_MAYBE(e, kj::runCatchingExceptions([&]() { validateActorName(name.c_str()); })) {
    raise(*e);
  }
}

}  // namespace troupe::python
