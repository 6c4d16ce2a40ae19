#pragma once
// One endpoint a RegistryResolver keeps registered: registers in the background, renews the
// lease, and registers again after the lease or the connection is lost.

#include <kj/async.h>

#include "troupe/resolver/detail/registry_link.h"
#include "troupe/resolver/resolver.h"

namespace troupe::resolver_detail {

// Loop thread only. See RegistryResolver::registerEndpoint for the contract.
class RegistryRegistration final : public Registration,
                                   public ConnectionListener,
                                   private kj::TaskSet::ErrorHandler {
public:
  // Starts registering `endpoint` (its name already validated and its parts filled in).
  RegistryRegistration(kj::Own<RegistryLink> link, Endpoint endpoint);

  // Refused before contacting the registry: whenRegistered() rejects with `refusal`.
  RegistryRegistration(kj::Own<RegistryLink> link, kj::Exception refusal);

  ~RegistryRegistration() noexcept(false);
  KJ_DISALLOW_COPY(RegistryRegistration);

  void setState(EndpointState state) override;
  kj::Promise<void> whenRegistered() override;
  void connectionLost() override;

private:
  enum class Phase : uint8_t {
    REGISTERING,  // a register() call is in flight
    WAITING,      // waiting out the backoff before the next attempt
    HELD,         // holding a lease, renewing it
    STOPPED,      // refused for good (or never started)
  };

  void taskFailed(kj::Exception&& exception) override;

  void attempt();
  void retryLater(kj::Duration delay);
  void held(schema::Lease::Client lease, kj::Duration granted, uint64_t epoch);
  void scheduleRenew();
  void renew();
  void sendState();
  void failed(kj::Exception&& e, uint64_t epoch);
  void stop(kj::Exception&& e);
  kj::StringPtr name() const { return endpoint.name; }

  kj::Own<RegistryLink> link;
  Endpoint endpoint;        // with the current state
  EndpointState sentState;  // the state the registry has (or will have) for the lease
  Phase phase = Phase::STOPPED;
  uint64_t generation = 0;  // bumped on every phase change: older callbacks do nothing
  uint32_t failures = 0;    // failed attempts since the last success
  bool everRegistered = false;
  kj::Maybe<schema::Lease::Client> lease;
  uint64_t leaseEpoch = 0;
  kj::Duration grantedTtl = 0 * kj::SECONDS;

  kj::ForkedPromise<void> registered = nullptr;
  kj::Own<kj::PromiseFulfiller<void>> registeredFulfiller;
  kj::Own<kj::TaskSet> tasks;
};

}  // namespace troupe::resolver_detail
