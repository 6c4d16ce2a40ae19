#include "troupe/resolver/registry_server.h"

#include <openssl/crypto.h>

#include <kj/debug.h>
#include <kj/vector.h>
#include <spdlog/spdlog.h>

#include "troupe/actor/address.h"
#include "troupe/actor/rpc_acceptor.h"
#include "troupe/actor/errors.h"
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
    auto granted = table->add(kj::mv(endpoint), params.getTtlMillis(), params.getJobCredential());
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
    auto credential = table->createJob(context.getParams().getJobId());
    context.getResults().setCredential(kj::StringPtr(credential).asBytes());
    OPENSSL_cleanse(credential.data(), credential.size());
    return kj::READY_NOW;
  }

private:
  kj::Own<RegistryTable> table;
};

}  // namespace

// ------------------------------------------------------------------------------------------------

struct RegistryServer::Impl final {
  Impl(EventLoop& loop, RegistryServerOptions options)
      : loop(loop),
        options(kj::mv(options)),
        log(this->options.logger ? this->options.logger : loop.logger()),
        table(kj::refcounted<RegistryTable>(loop, this->options, log)),
        registry(kj::heap<RegistryImpl>(kj::addRef(*table))),
        acceptor(kj::heap<RpcAcceptor>(loop, registry, this->options.maxMessageBytes, log,
                                       "registry", this->options.credentials,
                                       this->options.connections)) {}

  ~Impl() noexcept(false) {
    // The table first, so that the leases released as connections close remove nothing one by
    // one.
    table->shutdown();
    acceptor = nullptr;
  }

  EventLoop& loop;
  RegistryServerOptions options;
  std::shared_ptr<spdlog::logger> log;
  kj::Own<RegistryTable> table;
  schema::Registry::Client registry;
  bool stopped = false;
  kj::Own<RpcAcceptor> acceptor;
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

schema::Registry::Client RegistryServer::capability() { return impl->registry; }

kj::Promise<void> RegistryServer::drain() {
  KJ_IF_MAYBE(d, impl->drained) {
    return d->addBranch();
  }
  impl->stopped = true;
  impl->table->shutdown();
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
