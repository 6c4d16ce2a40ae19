// The extension module troupe._troupe; troupe/__init__.py is its public face.

#include <functional>
#include <optional>

#include <kj/exception.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "troupe/version.h"
#include "python/src/client.h"
#include "python/src/device.h"
#include "python/src/errors.h"
#include "python/src/host.h"
#include "python/src/jobs.h"
#include "python/src/logs.h"
#include "python/src/runtime.h"

namespace py = pybind11;
using namespace troupe::python;

namespace {

// What Python holds of a Notifier.
struct PyNotifier {
  kj::Own<Notifier> notifier = kj::atomicRefcounted<Notifier>();
  int fd() const { return notifier->fd(); }
  std::vector<uint64_t> take() { return notifier->take(); }
};

// Work started for asyncio (a call, or fetching the interface before a first call): its
// Completion, and what it gives Python once the Notifier says it finished.
struct Pending {
  kj::Own<Completion> completion;
  std::function<py::object(Completion&)> outcome;  // GIL held

  void notifyWith(const PyNotifier& n, uint64_t token) {
    completion->notifyWith(kj::atomicAddRef(*n.notifier), token);
  }
  py::object result() {
    runGilQueue();
    return outcome(*completion);
  }
  void cancel() { completion->cancel(); }
};

Pending pendingCall(kj::Own<CallCompletion> call) {
  return Pending{kj::mv(call),
                 [](Completion& c) { return resultOf(static_cast<CallCompletion&>(c)); }};
}

// For asyncio: null when calls of `self` know the interface, else fetching it.
template <typename Caller>
std::optional<Pending> pendingSchema(std::shared_ptr<Caller> self,
                                     kj::Function<Methods::Fetch()> fetch) {
  if (self->methods.known()) return std::nullopt;
  return Pending{self->methods.startFetch(kj::mv(fetch)), [self](Completion& c) {
                   self->methods.learn(c);
                   return py::object(py::none());
                 }};
}

troupe::ActorPoolOptions poolOptions(const std::string& balancing, uint32_t maxAttempts,
                                     std::optional<double> timeout, bool metrics) {
  troupe::ActorPoolOptions o;
  if (balancing == "least_outstanding") {
    o.balancing = troupe::Balancing::LEAST_OUTSTANDING;
  } else if (balancing != "round_robin") {
    raiseInvalidArgument("balancing must be 'round_robin' or 'least_outstanding', not '" +
                         balancing + "'");
  }
  if (maxAttempts == 0) raiseInvalidArgument("max_attempts must be at least 1");
  o.maxAttempts = maxAttempts;
  if (timeout) o.defaultDeadline = durationOf(*timeout, "timeout");
  o.metrics = metrics;
  return o;
}

// The module's plumbing: error classes, shutdown, the notifier and pending calls asyncio waits on.
void bindRuntime(py::module_& m) {
  m.doc() = "troupe's client, on an event loop of its own (see the troupe package)";
  m.def("_set_error_classes", &setErrorClasses);
  // What troupe throws (a bad name, size or URL) arrives as its troupe.Error class.
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const kj::Exception& e) {
      setError(e);
    }
  });
  m.def("_shutdown", []() { Runtime::get().shutdown(); });

  py::class_<PyNotifier>(m, "Notifier")
      .def(py::init<>())
      .def("fd", &PyNotifier::fd)
      .def("take", &PyNotifier::take);

  py::class_<Pending>(m, "Pending")
      .def("notify_with", &Pending::notifyWith)
      .def("result", &Pending::result)
      .def("cancel", &Pending::cancel);
}

// Resolvers: opened with credentials given as files, listed, and the groups they make.
void bindResolver(py::module_& m) {
  py::class_<PyResolver, std::shared_ptr<PyResolver>>(m, "Resolver")
      .def(py::init([](const std::string& url, const std::string& tokenFile,
                       const std::string& tlsCa, const std::string& tlsCert,
                       const std::string& tlsKey, const std::string& tlsServerName) {
             return std::make_shared<PyResolver>(
                 url, ClientCredentialFiles{tokenFile, tlsCa, tlsCert, tlsKey, tlsServerName});
           }),
           py::arg("url"), py::arg("token_file") = "", py::arg("tls_ca") = "",
           py::arg("tls_cert") = "", py::arg("tls_key") = "", py::arg("tls_server_name") = "")
      .def_readonly("url", &PyResolver::url)
      .def("list", &PyResolver::list)
      .def("jobs", &PyResolver::jobs)
      .def("group",
           [](std::shared_ptr<PyResolver> self, const std::string& job, const std::string& actor) {
             return std::make_shared<PyGroup>(kj::mv(self), job, actor);
           });
}

// Calling actors: groups, pools, references and broadcasts.
void bindClient(py::module_& m) {
  py::class_<PyGroup, std::shared_ptr<PyGroup>>(m, "Group")
      .def_readonly("job", &PyGroup::job)
      .def_readonly("actor", &PyGroup::actor)
      .def("wait_ready", &PyGroup::waitReady)
      .def("start_wait_ready",
           [](PyGroup& self, size_t count, double timeout) {
             return Pending{self.startWaitReady(count, timeout),
                            [](Completion& c) { return py::object(PyGroup::readyNames(c)); }};
           })
      .def("members", &PyGroup::members)
      .def("pool", [](std::shared_ptr<PyGroup> self, const std::string& balancing,
                      uint32_t maxAttempts, std::optional<double> timeout, bool metrics) {
        return std::make_shared<PyPool>(kj::mv(self),
                                        poolOptions(balancing, maxAttempts, timeout, metrics));
      });

  py::class_<PyPool, std::shared_ptr<PyPool>>(m, "Pool")
      .def("call", &PyPool::call)
      .def("start",
           [](PyPool& self, const std::string& method, py::handle params, py::dict fields,
              bool idempotent, std::optional<double> timeout, bool views) {
             return pendingCall(self.start(method, params, fields, idempotent, timeout, views));
           })
      .def("fetch_schema",
           [](std::shared_ptr<PyPool> self) {
             auto fetch = self->fetchFromAMember();
             return pendingSchema(kj::mv(self), kj::mv(fetch));
           })
      .def("broadcast", &PyPool::broadcast)
      .def("broadcast_blob", &PyPool::broadcastBlob);

  py::class_<PyRef, std::shared_ptr<PyRef>>(m, "Ref")
      .def(py::init<std::string, std::string>())
      .def_readonly("address", &PyRef::address)
      .def("call", &PyRef::call)
      .def("start",
           [](PyRef& self, const std::string& method, py::handle params, py::dict fields,
              bool idempotent, std::optional<double> timeout, bool views) {
             return pendingCall(self.start(method, params, fields, idempotent, timeout, views));
           })
      .def("fetch_schema", [](std::shared_ptr<PyRef> self) {
        auto fetch = self->fetchFromIt();
        return pendingSchema(kj::mv(self), kj::mv(fetch));
      });

  py::class_<PyBroadcast, std::shared_ptr<PyBroadcast>>(m, "Broadcast")
      .def("wait_all", [](PyBroadcast& self,
                          double timeout) { return self.wait(PyBroadcast::Wait::ALL, 0, timeout); })
      .def("wait_any", [](PyBroadcast& self,
                          double timeout) { return self.wait(PyBroadcast::Wait::ANY, 0, timeout); })
      .def("wait_quorum",
           [](PyBroadcast& self, size_t k, double timeout) {
             return self.wait(PyBroadcast::Wait::QUORUM, k, timeout);
           })
      .def("start", [](std::shared_ptr<PyBroadcast> self, const std::string& how, size_t k,
                       double timeout) {
        auto wait = how == "all"   ? PyBroadcast::Wait::ALL
                    : how == "any" ? PyBroadcast::Wait::ANY
                                   : PyBroadcast::Wait::QUORUM;
        auto done = self->start(wait, k, timeout);
        return Pending{kj::mv(done), [self](Completion& c) {
                         return py::object(self->results(static_cast<BroadcastCompletion&>(c)));
                       }};
      });
}

void bindResourceConfig(py::module_& m) {
  py::class_<troupe::ResourceConfig>(m, "ResourceConfig")
      .def(py::init<>())
      .def_static(
          "with_cpu",
          [](double cpus, const std::string& ram) {
            return troupe::ResourceConfig::withCpu(cpus, ram.c_str());
          },
          py::arg("cpus"), py::arg("ram") = "1g")
      .def_static(
          "with_gpu",
          [](const std::string& variant, uint32_t count, double cpus, const std::string& ram) {
            return troupe::ResourceConfig::withGpu(variant.c_str(), count, cpus, ram.c_str());
          },
          py::arg("variant"), py::arg("count"), py::arg("cpus") = 8.0, py::arg("ram") = "64g")
      .def_static(
          "with_tpu",
          [](py::object types, uint32_t slices) {
            std::vector<std::string> list;
            if (py::isinstance<py::str>(types)) {
              list.push_back(types.cast<std::string>());
            } else {
              list = types.cast<std::vector<std::string>>();
            }
            return troupe::ResourceConfig::withTpu(list, slices);
          },
          py::arg("types"), py::arg("slice_count") = 1)
      .def_readwrite("cpu", &troupe::ResourceConfig::cpu)
      .def_readwrite("ram_bytes", &troupe::ResourceConfig::ramBytes)
      .def_readwrite("replicas", &troupe::ResourceConfig::replicas)
      .def_property_readonly("device",
                             [](const troupe::ResourceConfig& r) { return toString(r.device); })
      .def_property_readonly("chip_count", &troupe::ResourceConfig::chipCount);
}

// Launching jobs: launchers (local and Slurm) and the jobs they submit.
void bindJobs(py::module_& m) {
  py::class_<PyLauncher, std::shared_ptr<PyLauncher>>(m, "Launcher")
      .def_static("local",
                  [](const std::string& resolver, const std::string& logDirectory,
                     std::optional<double> grace, double cpus, uint64_t ramBytes, int32_t gpus) {
                    troupe::LocalLauncherOptions o;
                    o.resolver = resolver;
                    o.logDirectory = logDirectory;
                    if (grace) o.terminateGrace = durationOf(*grace, "terminate_grace");
                    o.cpus = cpus;
                    o.ramBytes = ramBytes;
                    o.gpus = gpus;
                    return std::make_shared<PyLauncher>(kj::mv(o));
                  })
      .def_static("slurm",
                  [](const std::string& resolver, const std::string& partition,
                     std::optional<double> timeLimit, const std::string& logDirectory,
                     std::optional<double> grace, std::optional<double> pollInitial,
                     std::optional<double> pollMax, std::vector<std::string> sbatchArgs,
                     const std::string& program) {
                    troupe::SlurmLauncherOptions o;
                    o.resolver = resolver;
                    o.partition = partition;
                    if (timeLimit) o.timeLimit = durationOf(*timeLimit, "time_limit");
                    o.logDirectory = logDirectory;
                    if (grace) o.terminateGrace = durationOf(*grace, "terminate_grace");
                    if (pollInitial) o.pollInitial = durationOf(*pollInitial, "poll_initial");
                    if (pollMax) o.pollMax = durationOf(*pollMax, "poll_max");
                    o.sbatchArgs = kj::mv(sbatchArgs);
                    o.program = program;
                    return std::make_shared<PyLauncher>(kj::mv(o));
                  })
      .def_readonly("resolver_url", &PyLauncher::resolverUrl)
      .def_readonly("log_directory", &PyLauncher::logDirectory)
      .def("submit", &PyLauncher::submit)
      .def("drain", &PyLauncher::drain)
      .def("slurm_job_id", &PyLauncher::slurmJobId);

  py::class_<PyJob, std::shared_ptr<PyJob>>(m, "Job")
      .def_readonly("id", &PyJob::id)
      .def("status", &PyJob::status)
      .def("reason", &PyJob::reason)
      .def("wait", &PyJob::wait)
      .def("logs", &PyJob::logs)
      .def("terminate", &PyJob::terminate)
      .def("replicas", &PyJob::replicas);
}

}  // namespace

PYBIND11_MODULE(_troupe, m) {
  m.attr("__version__") = troupe::VERSION;
  bindRuntime(m);
  bindLogs(m);
  bindValues(m);
  bindDevice(m);
  bindResolver(m);
  bindClient(m);
  bindResourceConfig(m);
  bindJobs(m);
  py::class_<HostedActor>(m, "HostedActor")
      .def(py::init([](const std::string& path, const std::string& text,
                       const std::string& interface, py::object impl, const std::string& name,
                       const std::string& listen, uint32_t maxConcurrency,
                       std::vector<std::string> importPath, bool catchSigint, bool views,
                       std::vector<std::pair<std::string, int>> blobs) {
        return std::make_unique<HostedActor>(SchemaSource{path, text}, interface, kj::mv(impl),
                                             ServeOptions{name, listen, maxConcurrency,
                                                          kj::mv(importPath), catchSigint, views,
                                                          kj::mv(blobs)});
      }))
      .def_property_readonly("address", &HostedActor::address)
      .def_property_readonly("endpoints", &HostedActor::endpoints)
      .def("stop", &HostedActor::stop)
      .def("wait", &HostedActor::wait);
  m.def("serve", [](const std::string& schema, const std::string& interface, py::object impl,
                    const std::string& name, const std::string& listen, uint32_t maxConcurrency,
                    std::vector<std::string> importPath) {
    serve(SchemaSource{schema, {}}, interface, kj::mv(impl),
          ServeOptions{name, listen, maxConcurrency, kj::mv(importPath), true});
  });
}
