#pragma once
// A job's control (stop, logs) that a launcher offers through the registry: served to the
// registry as a JobControl capability, offered again on each new connection, revoked when the
// offer is dropped.

#include <string>

#include <kj/async.h>
#include <kj/refcount.h>

#include "troupe/resolver/detail/registry_link.h"
#include "troupe/resolver/resolver.h"

namespace troupe::resolver_detail {

// What the capabilities handed to the registry call; the offer empties it when dropped, so that
// a capability the registry still holds answers that the launcher no longer serves the job.
struct ControlSlot : public kj::Refcounted {
  kj::Maybe<kj::Own<JobControl>> control;
};

// Loop thread only. See Resolver::serveJobControl.
class RegistryJobControlOffer final : public JobControlOffer,
                                      public ConnectionListener,
                                      public kj::TaskSet::ErrorHandler {
public:
  RegistryJobControlOffer(kj::Own<RegistryLink> link, std::string jobId, std::string credential,
                          std::string logLocation, kj::Own<JobControl> control);
  ~RegistryJobControlOffer() noexcept(false);
  KJ_DISALLOW_COPY(RegistryJobControlOffer);

  void connectionLost() override;
  void taskFailed(kj::Exception&& exception) override;

private:
  void offer(uint32_t attempt);

  kj::Own<RegistryLink> link;
  std::string jobId;
  std::string credential;
  std::string logLocation;
  kj::Own<ControlSlot> slot;
  kj::Own<kj::TaskSet> tasks;
};

// The capability of `slot` for the registry.
schema::JobControl::Client jobControlCapability(kj::Own<ControlSlot> slot);

}  // namespace troupe::resolver_detail
