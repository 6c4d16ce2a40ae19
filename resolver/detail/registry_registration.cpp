#include "troupe/resolver/detail/registry_registration.h"

#include <kj/debug.h>
#include <spdlog/spdlog.h>

#include "troupe/base/errors.h"

namespace troupe::resolver_detail {

namespace {

using RegisterResponse = capnp::Response<schema::Registry::RegisterResults>;
using RenewResponse = capnp::Response<schema::Lease::RenewResults>;
using SetStateResponse = capnp::Response<schema::Lease::SetStateResults>;

// 0 (ask for the registry's default) stays 0; anything else is at least 1 ms.
uint32_t toMillis(kj::Duration d) {
  if (d <= 0 * kj::SECONDS) return 0;
  int64_t ms = d / kj::MILLISECONDS;
  if (ms < 1) return 1;
  if (ms > int64_t{UINT32_MAX}) return UINT32_MAX;
  return static_cast<uint32_t>(ms);
}

}  // namespace

RegistryRegistration::RegistryRegistration(kj::Own<RegistryLink> link, Endpoint endpoint)
    : link(kj::mv(link)),
      endpoint(kj::mv(endpoint)),
      sentState(this->endpoint.state),
      tasks(kj::heap<kj::TaskSet>(static_cast<kj::TaskSet::ErrorHandler&>(*this))) {
  auto paf = kj::newPromiseAndFulfiller<void>();
  registered = paf.promise.fork();
  registeredFulfiller = kj::mv(paf.fulfiller);
  this->link->addListener(*this);
  attempt();
}

RegistryRegistration::RegistryRegistration(kj::Own<RegistryLink> link, kj::Exception refusal)
    : link(kj::mv(link)),
      sentState(EndpointState::STARTING),
      tasks(kj::heap<kj::TaskSet>(static_cast<kj::TaskSet::ErrorHandler&>(*this))) {
  registered = kj::Promise<void>(kj::mv(refusal)).fork();
  registeredFulfiller = kj::newPromiseAndFulfiller<void>().fulfiller;  // never used
}

RegistryRegistration::~RegistryRegistration() noexcept(false) {
  if (listenerLink.isLinked()) link->removeListener(*this);
  ++generation;
  tasks = nullptr;  // cancels the calls in flight
  if (lease != nullptr) {
    link->log->info("unregistering '{}' from the registry at {}", endpoint.name, link->addressText);
  }
  lease = nullptr;  // releasing the lease removes the endpoint at once
  if (registeredFulfiller->isWaiting()) {
    registeredFulfiller->reject(makeError(
        ErrorCode::DISCONNECTED,
        kj::str("the registration of '", name(), "' was dropped before the registry accepted it")));
  }
}

void RegistryRegistration::taskFailed(kj::Exception&& exception) {
  link->log->warn("registration of '{}': {}", endpoint.name, exception.getDescription().cStr());
}

kj::Promise<void> RegistryRegistration::whenRegistered() { return registered.addBranch(); }

void RegistryRegistration::setState(EndpointState state) {
  endpoint.state = state;
  if (phase == Phase::HELD && state != sentState) sendState();
  // Otherwise the next registration carries it.
}

void RegistryRegistration::connectionLost() {
  if (phase != Phase::HELD || leaseEpoch == link->epoch()) return;
  lease = nullptr;
  attempt();
}

void RegistryRegistration::attempt() {
  phase = Phase::REGISTERING;
  uint64_t gen = ++generation;
  auto target = link->registry();
  uint64_t epoch = link->epoch();
  auto request = target.registerRequest();
  endpoint.toCapnp(request.initEndpoint());
  request.setTtlMillis(toMillis(link->options.ttl));
  request.setJobCredential(link->credentials().jobTokenFor(endpoint.jobId));
  sentState = endpoint.state;
  tasks->add(link->withDeadline<RegisterResponse>(request.send(), "register")
                 .then(
                     [this, gen, epoch](RegisterResponse&& response) {
                       if (gen != generation) return;  // dropping `response` releases the lease
                       held(response.getLease(), response.getTtlMillis() * kj::MILLISECONDS, epoch);
                     },
                     [this, gen, epoch](kj::Exception&& e) {
                       if (gen != generation) return;
                       failed(kj::mv(e), epoch);
                     }));
}

void RegistryRegistration::retryLater(kj::Duration delay) {
  phase = Phase::WAITING;
  uint64_t gen = ++generation;
  ++failures;
  tasks->add(link->loop.timer().afterDelay(delay).then([this, gen]() {
    if (gen == generation) attempt();
  }));
}

void RegistryRegistration::held(schema::Lease::Client newLease, kj::Duration granted,
                                uint64_t epoch) {
  phase = Phase::HELD;
  ++generation;
  lease = kj::mv(newLease);
  leaseEpoch = epoch;
  grantedTtl = granted;  // 0 from a registry that does not say
  if (failures > 0 || everRegistered) {
    link->log->info("registered '{}' with the registry at {} again", endpoint.name,
                    link->addressText);
  } else {
    link->log->info("registered '{}' with the registry at {}", endpoint.name, link->addressText);
  }
  failures = 0;
  if (!everRegistered) {
    everRegistered = true;
    registeredFulfiller->fulfill();
  }
  if (endpoint.state != sentState) sendState();
  link->ensureProbe();
  scheduleRenew();
}

void RegistryRegistration::scheduleRenew() {
  uint64_t gen = generation;
  tasks->add(link->loop.timer().afterDelay(link->renewInterval(grantedTtl)).then([this, gen]() {
    if (gen == generation) renew();
  }));
}

void RegistryRegistration::renew() {
  uint64_t gen = generation;
  uint64_t epoch = leaseEpoch;
  auto request = KJ_ASSERT_NONNULL(lease).renewRequest();
  tasks->add(link->withDeadline<RenewResponse>(request.send(), "renew")
                 .then(
                     [this, gen](RenewResponse&& response) {
                       if (gen != generation) return;
                       grantedTtl = response.getTtlMillis() * kj::MILLISECONDS;
                       scheduleRenew();
                     },
                     [this, gen, epoch](kj::Exception&& e) {
                       if (gen != generation) return;
                       failed(kj::mv(e), epoch);
                     }));
}

void RegistryRegistration::sendState() {
  sentState = endpoint.state;
  uint64_t gen = generation;
  uint64_t epoch = leaseEpoch;
  auto request = KJ_ASSERT_NONNULL(lease).setStateRequest();
  request.setState(toCapnp(endpoint.state));
  tasks->add(link->withDeadline<SetStateResponse>(request.send(), "setState")
                 .then([](SetStateResponse&&) {},
                       [this, gen, epoch](kj::Exception&& e) {
                         if (gen != generation) return;
                         failed(kj::mv(e), epoch);
                       }));
}

void RegistryRegistration::failed(kj::Exception&& e, uint64_t epoch) {
  auto code = errorCode(e);
  bool wasHeld = phase == Phase::HELD;
  lease = nullptr;
  // A registry that stopped answering (a partition leaves no RST) is as good as gone.
  if (code == ErrorCode::DISCONNECTED || code == ErrorCode::DEADLINE_EXCEEDED) {
    link->connectionBroken(epoch);
  }

  // Once registered, a job that ended may run again (set RUNNING by its launcher) and a name
  // taken over may be given back: those are retried with backoff.
  if (code == ErrorCode::INVALID_ARGUMENT || code == ErrorCode::PERMISSION_DENIED ||
      ((code == ErrorCode::JOB_ENDED || code == ErrorCode::NAME_TAKEN) && !everRegistered)) {
    stop(kj::mv(e));
    return;
  }
  if (wasHeld) {
    // The lease is gone (expired, replaced, its job ended) or its connection broke: register
    // again right away; backoff applies if that fails.
    link->log->warn("lost the registration of '{}' with the registry at {} ({}); registering again",
                    endpoint.name, link->addressText, e.getDescription().cStr());
    attempt();
    return;
  }
  auto delay = link->backoff(failures);
  if (failures == 0) {
    link->log->warn("cannot register '{}' with the registry at {} ({}); retrying with backoff",
                    endpoint.name, link->addressText, e.getDescription().cStr());
  } else {
    link->log->debug("cannot register '{}' with the registry at {} ({}); retrying in {} ms",
                     endpoint.name, link->addressText, e.getDescription().cStr(),
                     delay / kj::MILLISECONDS);
  }
  retryLater(delay);
}

void RegistryRegistration::stop(kj::Exception&& e) {
  phase = Phase::STOPPED;
  ++generation;
  lease = nullptr;
  if (everRegistered) {
    link->log->warn("'{}' stays unregistered: the registry at {} refused it again ({})",
                    endpoint.name, link->addressText, e.getDescription().cStr());
  } else {
    link->log->warn("the registry at {} refused '{}': {}", link->addressText, endpoint.name,
                    e.getDescription().cStr());
    registeredFulfiller->reject(kj::mv(e));
  }
}

}  // namespace troupe::resolver_detail
