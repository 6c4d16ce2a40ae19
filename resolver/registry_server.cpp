#include "troupe/resolver/registry_server.h"

#include <openssl/crypto.h>

#include <kj/debug.h>
#include <kj/vector.h>
#include <spdlog/spdlog.h>

#include "troupe/base/errors.h"
#include "troupe/net/address.h"
#include "troupe/net/rpc_acceptor.h"
#include "troupe/resolver/detail/registry_http.h"
#include "troupe/resolver/detail/registry_table.h"
#include "troupe/resolver/registry_wire.h"

namespace troupe {

namespace {

using resolver_detail::RegistryTable;

// One registration, held by the registrant. Releasing it removes the entry it still holds.
class LeaseImpl final : public schema::Lease::Server {
public:
  LeaseImpl(kj::Own<RegistryTable> table, std::string name, uint64_t leaseId)
      : table(kj::mv(table)), name(kj::mv(name)), leaseId(leaseId) {}

  ~LeaseImpl() noexcept(false) {
    KJ_IF_MAYBE(e, kj::runCatchingExceptions([this]() { table->release(key(), leaseId); })) {
      KJ_LOG(ERROR, "releasing a lease failed", *e);
    }
  }

protected:
  kj::Promise<void> renew(RenewContext context) override {
    auto ttl = table->renew(key(), leaseId);
    context.getResults().setTtlMillis(static_cast<uint32_t>(ttl / kj::MILLISECONDS));
    return kj::READY_NOW;
  }

  kj::Promise<void> setState(SetStateContext context) override {
    table->setState(key(), leaseId, fromCapnp(context.getParams().getState()));
    return kj::READY_NOW;
  }

private:
  kj::StringPtr key() const { return name; }

  kj::Own<RegistryTable> table;
  std::string name;
  uint64_t leaseId;
};

// Held by the watching client; releasing it ends the watch.
class WatchHandleImpl final : public schema::WatchHandle::Server {
public:
  WatchHandleImpl(kj::Own<RegistryTable> table, uint64_t id) : table(kj::mv(table)), id(id) {}
  ~WatchHandleImpl() noexcept(false) { table->removeWatcher(id); }

private:
  kj::Own<RegistryTable> table;
  uint64_t id;
};

class RegistryImpl final : public schema::Registry::Server {
public:
  explicit RegistryImpl(kj::Own<RegistryTable> table) : table(kj::mv(table)) {}

protected:
  kj::Promise<void> register_(RegisterContext context) override {
    auto params = context.getParams();
    auto endpoint = Endpoint::fromCapnp(params.getEndpoint());
    std::string name = endpoint.name;
    RegistryTable::Granted granted{0, 0 * kj::SECONDS};
    KJ_IF_MAYBE(e, kj::runCatchingExceptions([&]() {
                  granted = table->add(kj::mv(endpoint), params.getTtlMillis(),
                                       params.getJobCredential());
                })) {
      table->countRefusal(errorCode(*e));
      return kj::mv(*e);
    }
    auto results = context.getResults();
    results.setLease(kj::heap<LeaseImpl>(kj::addRef(*table), kj::mv(name), granted.leaseId));
    results.setTtlMillis(static_cast<uint32_t>(granted.ttl / kj::MILLISECONDS));
    return kj::READY_NOW;
  }

  kj::Promise<void> resolve(ResolveContext context) override {
    auto found = table->resolve(context.getParams().getPrefix());
    context.releaseParams();
    size_t words = 16;
    for (auto& e : found) words += (resolver_detail::endpointBytes(e) + 256) / sizeof(capnp::word);
    context.initResults(capnp::MessageSize{words, 0});
    auto list = context.getResults().initEndpoints(found.size());
    for (size_t i = 0; i < found.size(); ++i) found[i].toCapnp(list[i]);
    return kj::READY_NOW;
  }

  kj::Promise<void> watch(WatchContext context) override {
    auto params = context.getParams();
    auto id = table->addWatcher(params.getPrefix(), params.getWatcher());
    context.getResults().setHandle(kj::heap<WatchHandleImpl>(kj::addRef(*table), id));
    return kj::READY_NOW;
  }

  kj::Promise<void> jobStatus(JobStatusContext context) override {
    auto status = table->jobStatus(context.getParams().getJobId());
    toCapnp(status, context.getResults().initStatus());
    return kj::READY_NOW;
  }

  kj::Promise<void> setJobStatus(SetJobStatusContext context) override {
    auto params = context.getParams();
    table->setJobStatus(fromCapnp(params.getStatus()), params.getJobCredential());
    return kj::READY_NOW;
  }

  kj::Promise<void> createJob(CreateJobContext context) override {
    auto params = context.getParams();
    auto credential = table->createJob(params.getJobId(),
                                       JobDescription{params.getLauncher(), params.getReplicas()});
    context.getResults().setCredential(kj::StringPtr(credential).asBytes());
    OPENSSL_cleanse(credential.data(), credential.size());
    return kj::READY_NOW;
  }

  kj::Promise<void> listJobs(ListJobsContext context) override {
    auto jobs = table->jobList();
    size_t words = 16;
    for (auto& j : jobs) {
      words += (j.status.jobId.size() + j.status.reason.size() + j.launcher.size() + 160) /
               sizeof(capnp::word);
    }
    context.initResults(capnp::MessageSize{words, 0});
    auto list = context.getResults().initJobs(jobs.size());
    for (size_t i = 0; i < jobs.size(); ++i) toCapnp(jobs[i], list[i]);
    return kj::READY_NOW;
  }

  kj::Promise<void> serveJobControl(ServeJobControlContext context) override {
    auto params = context.getParams();
    table->setControl(params.getJobId(), params.getJobCredential(), params.getControl(),
                      params.getLogLocation());
    return kj::READY_NOW;
  }

  kj::Promise<void> stopJob(StopJobContext context) override {
    auto params = context.getParams();
    std::string jobId = params.getJobId();
    auto control = table->controlToStop(jobId, params.getCredential());
    auto request = control.stopRequest();
    request.setGraceMillis(params.getGraceMillis());
    context.releaseParams();
    // A launcher that ends with its job (troupe launch) may go before its answer does: the job
    // having ended is the answer then.
    auto stopped = request.send().ignoreResult().catch_(
        [table = kj::addRef(*table), jobId](kj::Exception&& e) mutable -> kj::Promise<void> {
          bool ended = table->jobStatus(jobId).state == JobState::ENDED;
          if (ended && e.getType() == kj::Exception::Type::DISCONNECTED) return kj::READY_NOW;
          return kj::mv(e);
        });
    return relayed(jobId, kj::mv(stopped));
  }

  kj::Promise<void> readJobLog(ReadJobLogContext context) override {
    auto params = context.getParams();
    std::string jobId = params.getJobId();
    auto request = table->controlToRead(jobId).readLogRequest();
    request.setReplica(params.getReplica());
    request.setOffset(params.getOffset());
    request.setMaxBytes(kj::min(params.getMaxBytes(), MAX_LOG_PIECE_BYTES));
    auto read = request.send().then([context](auto&& response) mutable {
      auto piece = response.getPiece();
      context.initResults(capnp::MessageSize{piece.totalSize().wordCount + 16, 0}).setPiece(piece);
    });
    return relayed(jobId, kj::mv(read));
  }

private:
  // `call` to a job's launcher, which may be gone: then the caller is told so and where the
  // job's logs lie (UNREACHABLE), and the registry forgets the launcher.
  kj::Promise<void> relayed(const std::string& jobId, kj::Promise<void> call) {
    return call.catch_(
        [table = kj::addRef(*table), jobId](kj::Exception&& e) mutable -> kj::Promise<void> {
          if (e.getType() == kj::Exception::Type::DISCONNECTED) {
            return makeError(ErrorCode::UNREACHABLE, table->controlLost(jobId));
          }
          // The launcher's own error, passed on as if raised here: one "remote exception" only.
          return makeError(errorCode(e), errorMessage(e));
        });
  }

  kj::Own<RegistryTable> table;
};

}  // namespace

// ------------------------------------------------------------------------------------------------

struct RegistryServer::Impl final : public MetricsSource {
  Impl(EventLoop& loop, RegistryServerOptions options)
      : loop(loop),
        options(kj::mv(options)),
        log(this->options.logger ? this->options.logger : loop.logger()),
        table(kj::refcounted<RegistryTable>(loop, this->options, log)),
        registry(kj::heap<RegistryImpl>(kj::addRef(*table))),
        acceptor(kj::heap<RpcAcceptor>(loop, registry, this->options.maxMessageBytes, log,
                                       "registry", this->options.credentials,
                                       this->options.connections)) {
    metricsRegistration = loop.metrics().add(*this);
  }

  ~Impl() noexcept(false) {
    http = nullptr;
    httpRoutes = nullptr;
    // The table first, so that the leases released as connections close remove nothing one by
    // one.
    table->shutdown();
    acceptor = nullptr;
  }

  void collectMetrics(MetricsSnapshot& out) const override {
    table->collectMetrics(out);
    acceptor->collectMetrics(out, {{"server", "registry"}});
    if (httpRoutes) {
      out.add("troupe_registry_dashboard_streams", "Dashboard event streams open now.",
              MetricType::GAUGE, {}, static_cast<double>(httpRoutes->streamCount()));
    }
  }

  EventLoop& loop;
  RegistryServerOptions options;
  std::shared_ptr<spdlog::logger> log;
  kj::Own<RegistryTable> table;
  schema::Registry::Client registry;
  bool stopped = false;
  kj::Own<RpcAcceptor> acceptor;
  kj::Own<resolver_detail::RegistryHttp> httpRoutes;
  kj::Own<HttpEndpoint> http;
  MetricsSet::Registration metricsRegistration;
  kj::Maybe<kj::ForkedPromise<void>> drained;
  kj::Canceler draining;  // last: the drain refers to the acceptor
};

RegistryServer::RegistryServer(EventLoop& loop, RegistryServerOptions options)
    : impl(kj::heap<Impl>(loop, kj::mv(options))) {
  KJ_REQUIRE(impl->options.minTtl > 0 * kj::SECONDS && impl->options.minTtl <= impl->options.maxTtl,
             "RegistryServerOptions: need 0 < minTtl <= maxTtl");
}

RegistryServer::~RegistryServer() noexcept(false) {}

std::string RegistryServer::listen(kj::StringPtr text) {
  KJ_REQUIRE(!impl->stopped, "cannot listen on a registry that has stopped");
  auto bound = impl->acceptor->listen(text).toString();
  impl->log->info("registry listening on {}", bound);
  return bound;
}

std::string RegistryServer::listenHttp(kj::StringPtr address) {
  KJ_REQUIRE(!impl->stopped, "cannot serve HTTP for a registry that has stopped");
  KJ_REQUIRE(impl->http.get() == nullptr, "the registry serves HTTP on one address only");
  auto credentials = impl->options.credentials ? impl->options.credentials
                                               : loopCredentials(impl->loop);
  auto options = impl->options.http;
  if (!options.credentials) options.credentials = credentials;
  if (!options.logger) options.logger = impl->log;
  options.publicPaths = resolver_detail::RegistryHttp::publicPaths();
  resolver_detail::HistoryOptions history{.interval = impl->options.historyInterval,
                                          .length = impl->options.historyLength,
                                          .maxSeries = impl->options.maxHistorySeries};
  auto routes = kj::heap<resolver_detail::RegistryHttp>(impl->loop, kj::addRef(*impl->table),
                                                        options.credentials, history, impl->log);
  impl->http = kj::heap<HttpEndpoint>(impl->loop, address, kj::mv(options), *routes);
  routes->attach(*impl->http);
  impl->httpRoutes = kj::mv(routes);
  impl->log->info("registry serving HTTP on {} (the dashboard at /, /metrics)", impl->http->url());
  return impl->http->url();
}

schema::Registry::Client RegistryServer::capability() { return impl->registry; }

kj::Promise<void> RegistryServer::drain() {
  KJ_IF_MAYBE(d, impl->drained) {
    return d->addBranch();
  }
  impl->stopped = true;
  impl->table->shutdown();
  impl->http = nullptr;
  impl->acceptor->closeListeners();
  auto& i = *impl;
  auto done = impl->acceptor->whenWritten()
                  .exclusiveJoin(impl->loop.timer().afterDelay(impl->options.drainGracePeriod))
                  .then([&i]() {
                    auto count = i.acceptor->connectionCount();
                    i.acceptor->closeConnections();
                    i.log->info("registry stopped ({} connections closed)", count);
                  });
  auto& fork = impl->drained.emplace(impl->draining.wrap(kj::mv(done)).fork());
  return fork.addBranch();
}

kj::Array<std::string> RegistryServer::listenAddresses() const {
  return KJ_MAP(a, impl->acceptor->bound()) { return a.toString(); };
}

size_t RegistryServer::endpointCount() const { return impl->table->endpointCount(); }
size_t RegistryServer::watcherCount() const { return impl->table->watcherCount(); }
size_t RegistryServer::queuedEventBytes() const { return impl->table->queuedEventBytes(); }
size_t RegistryServer::connectionCount() const { return impl->acceptor->connectionCount(); }

}  // namespace troupe
