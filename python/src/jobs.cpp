#include "python/src/jobs.h"

#include "python/src/errors.h"

namespace py = pybind11;

namespace troupe::python {

namespace {

// Runs `fn` on the loop and waits; raises what it failed with.
template <typename T>
struct ValueCompletion final : public Completion {
  T value{};
};

// `fn(loop)`'s value, computed on the loop.
template <typename T, typename Fn>
T onLoop(Fn&& fn) {
  auto done = kj::atomicRefcounted<ValueCompletion<T>>();
  runOn<ValueCompletion<T>>(done,
                            [&fn](EventLoop& loop, ValueCompletion<T>& c) -> kj::Promise<void> {
                              c.value = fn(loop);
                              return kj::READY_NOW;
                            });
  return kj::mv(done->value);
}

kj::Maybe<kj::Duration> graceOf(std::optional<double> grace) {
  if (!grace) return nullptr;
  return durationOf(*grace, "grace");
}

}  // namespace

template <typename L, typename Options>
void PyLauncher::make(Options options, kj::Function<uint64_t(L&, kj::StringPtr)> slurmIdOf) {
  onLoop<bool>([&](EventLoop& loop) {
    auto made = kj::heap<L>(loop, kj::mv(options));
    auto& l = *made;
    resolverUrl = l.resolverUrl();
    logDirectory = l.logDirectory();
    slurmId = [&l, of = kj::mv(slurmIdOf)](kj::StringPtr name) mutable { return of(l, name); };
    launcher.set(kj::mv(made));
    return true;
  });
}

PyLauncher::PyLauncher(LocalLauncherOptions options) {
  // Python handles its signals itself: the launcher's jobs stop with drain() or with it.
  options.stopJobsOnSignal = false;
  make<LocalLauncher>(kj::mv(options), [](LocalLauncher&, kj::StringPtr) -> uint64_t { return 0; });
}

PyLauncher::PyLauncher(SlurmLauncherOptions options) {
  make<SlurmLauncher>(kj::mv(options),
                      [](SlurmLauncher& l, kj::StringPtr name) { return l.slurmJobId(name); });
}

std::shared_ptr<PyJob> PyLauncher::submit(const std::string& name, std::vector<std::string> argv,
                                          uint32_t replicas,
                                          std::optional<ResourceConfig> resources,
                                          std::map<std::string, std::string> environment,
                                          uint32_t maxRetriesFailure) {
  if (argv.empty()) raiseInvalidArgument("submit: argv must name the program to run");
  JobRequest request;
  request.name = name;
  request.entrypoint = Entrypoint::binary(argv[0],
                                          std::vector<std::string>(argv.begin() + 1, argv.end()));
  if (resources) request.resources = *resources;
  request.environment = kj::mv(environment);
  request.replicas = replicas;
  request.maxRetriesFailure = maxRetriesFailure;
  auto job = std::make_shared<PyJob>(shared_from_this(), name);
  onLoop<bool>([&](EventLoop&) {
    job->handle.set(kj::heap<JobHandle>(launcher.get().submit(kj::mv(request))));
    return true;
  });
  return job;
}

void PyLauncher::drain(std::optional<double> grace) {
  auto g = graceOf(grace);
  auto done = kj::atomicRefcounted<Completion>();
  runOn<Completion>(
      done,
      [self = shared_from_this(), g](EventLoop&, Completion&) {
        return self->launcher.get().drain(g).attach(kj::mv(self));
      },
      true);
}

uint64_t PyLauncher::slurmJobId(const std::string& name) {
  return onLoop<uint64_t>([&](EventLoop&) { return slurmId(name); });
}

PyJob::PyJob(std::shared_ptr<PyLauncher> l, std::string id) : launcher(kj::mv(l)), id(kj::mv(id)) {}

std::string PyJob::status() {
  return onLoop<std::string>([&](EventLoop&) { return toString(handle.get().status()).cStr(); });
}

std::string PyJob::reason() {
  return onLoop<std::string>([&](EventLoop&) { return handle.get().reason(); });
}

std::string PyJob::wait(double timeout) {
  auto limit = durationOf(timeout, "timeout");
  auto done = kj::atomicRefcounted<ValueCompletion<std::string>>();
  runOn<ValueCompletion<std::string>>(
      done,
      [self = shared_from_this(), limit](EventLoop&, ValueCompletion<std::string>& c) {
        return self->handle.get()
            .wait(limit)
            .then([&c](JobPhase phase) { c.value = toString(phase).cStr(); })
            .attach(kj::mv(self));
      },
      true);
  return done->value;
}

std::vector<std::string> PyJob::logs(size_t lines) {
  return onLoop<std::vector<std::string>>([&](EventLoop&) { return handle.get().logs(lines); });
}

void PyJob::terminate(std::optional<double> grace) {
  auto g = graceOf(grace);
  auto done = kj::atomicRefcounted<Completion>();
  runOn<Completion>(
      done,
      [self = shared_from_this(), g](EventLoop&, Completion&) {
        return self->handle.get().terminate(g).attach(kj::mv(self));
      },
      true);
}

py::list PyJob::replicas() {
  auto all = onLoop<std::vector<ReplicaInfo>>([&](EventLoop&) { return handle.get().replicas(); });
  py::list out;
  for (auto& r : all) out.append(py::make_tuple(r.index, r.pid, r.starts, r.logPath));
  return out;
}

}  // namespace troupe::python
