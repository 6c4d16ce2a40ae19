#pragma once
// Python objects served as troupe actors, on a thread of their own: troupe.serve(schema,
// interface, obj, name=...) with a hand-written schema, and troupe.host_actor(obj, name=...) with
// one troupe.actor generated from the class's annotations.

#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <capnp/schema-parser.h>
#include <kj/async.h>
#include <kj/thread.h>
#include <kj/time.h>
#include <pybind11/pybind11.h>

namespace troupe::python {

struct ServeOptions {
  std::string name;                     // the actor's name ("calc"): endpoint <job>/<name>-<i>
  std::string listen;                   // "" for the server's default address
  uint32_t maxConcurrency = 1;          // calls at once (0: no limit); other than 1: on workers
  std::vector<std::string> importPath;  // for the schema's imports, before /usr/include
  bool catchSigint = true;              // SIGINT drains as SIGTERM does (else Python keeps it)
  bool views = false;  // large received Data reach the object as views (toPython(), values.h)
  // Blobs the object takes (ActorServer::acceptBlobs), each with the CUDA device it is received
  // into (-1: host memory): each version of each is handed to its take_blob(name, version,
  // data), data a read-only memoryview over the bytes received (a troupe.DeviceArray for a
  // device).
  std::vector<std::pair<std::string, int>> blobs;
};

// Where an interface's schema comes from: the file at `path`, or, when `text` is not empty, that
// text, read as if it were the file `path` (which names it in errors).
struct SchemaSource {
  std::string path;
  std::string text;
};

// One Python object served as an actor in a replica of the job the environment names
// (TROUPE_JOB_ID, TROUPE_RESOLVER, ...), exactly as hostActor() serves a C++ actor: published,
// listed with its schema, drained on SIGTERM (and SIGINT, with catchSigint) or stop(). It serves
// on a thread of its own, with an event loop of its own, calling the object's methods with the
// GIL held: each call runs obj.<method>(**params), and its return value (a dict, or None) becomes
// the results; what it raises reaches the caller as an actor's error with its type, message and
// traceback, and is logged with them. Thread-safe.
class HostedActor {
public:
  // Parses the schema, finds the interface, and starts serving; returns once the actor is
  // published (or listening, without a resolver). GIL held. Raises InvalidArgument for a bad
  // schema, interface or name, and what starting the replica failed with.
  HostedActor(const SchemaSource& schema, const std::string& interfaceName, pybind11::object impl,
              ServeOptions options);
  // Stops (as stop() with the default grace) and waits until stopped. GIL held.
  ~HostedActor() noexcept(false);
  KJ_DISALLOW_COPY(HostedActor);

  // Starts the drain (new calls refused, calls in flight finish within `grace` seconds, default
  // the server's); returns at once. Does nothing once stopping. Any thread.
  void stop(std::optional<double> grace);

  // Waits until the actor stopped, up to `timeout` seconds (none: for ever), with the GIL
  // released; a signal handler that raises (Ctrl-C) interrupts it. Returns whether it stopped,
  // and raises what serving failed with. GIL held.
  bool wait(std::optional<double> timeout);

  // The address it listens on ("tcp://127.0.0.1:40123"), and its endpoints' names.
  const std::string& address() const { return address_; }
  const std::vector<std::string>& endpoints() const { return endpoints_; }

private:
  enum class Phase { STARTING, SERVING, STOPPED };
  void run();
  // Serves until stopped, on the serving thread (its thread state kept); what it failed with.
  kj::Maybe<kj::Exception> serveHere();
  void finish(kj::Maybe<kj::Exception> failure);

  ServeOptions options;
  // The parser owns the schemas: it outlives the server (files first: they outlive the parser).
  struct Files;
  kj::Own<Files> files;
  capnp::SchemaParser parser;
  capnp::InterfaceSchema schema;
  std::optional<pybind11::object> impl;  // until the serving thread takes it (GIL held)

  std::mutex mutex;
  std::condition_variable changed;
  Phase phase = Phase::STARTING;
  kj::Maybe<kj::Exception> failure;
  kj::Maybe<kj::Own<kj::CrossThreadPromiseFulfiller<kj::Maybe<kj::Duration>>>> stopper;
  std::string address_;
  std::vector<std::string> endpoints_;

  kj::Maybe<kj::Own<kj::Thread>> thread;  // last: joined first
};

// Serves `impl` until it stops (SIGTERM, SIGINT or a drain request), with HostedActor, blocking
// the calling thread meanwhile. GIL held.
void serve(const SchemaSource& schema, const std::string& interfaceName, pybind11::object impl,
           const ServeOptions& options);

// Raises InvalidArgument unless `name` is a valid actor name.
void validateActorNameOrRaise(const std::string& name);

}  // namespace troupe::python
