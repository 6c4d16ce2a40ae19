#pragma once
// EtcdSession: the one lease every registration of an etcd client writes its key on, kept alive
// by one keepalive request a third of the TTL apart, however many endpoints the process hosts.

#include <cstdint>
#include <string>
#include <unordered_set>

#include <kj/async.h>
#include <kj/time.h>

namespace troupe::resolver_detail {

class EtcdClient;

class EtcdSession final : private kj::TaskSet::ErrorHandler {
public:
  // A key written on the lease. The session checks after each keepalive that etcd still holds
  // every holder's key on its lease, and tells a holder whose key is not.
  class Holder {
  public:
    virtual ~Holder() noexcept(false) = default;
    virtual const std::string& heldKey() const = 0;
    // `lease` no longer holds this holder's key: the lease lapsed or was lost with etcd's data,
    // or someone else wrote or deleted the key. `why` says which.
    virtual void lost(int64_t lease, kj::StringPtr why) = 0;
  };

  explicit EtcdSession(EtcdClient& client);
  ~EtcdSession() noexcept(false);
  KJ_DISALLOW_COPY(EtcdSession);

  // A registration starts and ends: while none is alive the session holds no lease.
  void join();
  // Ends a registration whose key was written on `lease` (0: none): once `settled` (its last
  // write answered), its key is deleted unless another lease holds it now; when this was the
  // last registration, the lease is revoked instead, which deletes every key on it.
  void leave(const std::string& key, int64_t lease, kj::Promise<void> settled);

  // The lease to write keys on, granted when none is held; callers at once share one grant.
  kj::Promise<int64_t> lease();

  // `holder` has written its key on the current lease / stops holding it.
  void hold(Holder& holder);
  void release(Holder& holder);

  // A write on `lease` failed: if it is still the current lease, ask etcd now whether it lives.
  void verify(int64_t lease);

private:
  void taskFailed(kj::Exception&& exception) override;
  void scheduleKeepAlive(kj::Duration delay);
  kj::Promise<void> keepAlive();
  // Range requests for every holder's key, a batch per transaction.
  kj::Promise<void> checkHolders(int64_t lease);
  // The lease is gone: every holder is told.
  void dropLease(int64_t lease, kj::StringPtr why);
  void revoke(int64_t lease);
  int64_t ttlSeconds() const;
  kj::Duration interval() const;  // between keepalives: a third of the TTL

  EtcdClient& client;
  size_t users = 0;
  int64_t current = 0;  // 0: none held
  bool granting = false;
  kj::ForkedPromise<int64_t> grant;
  bool keepAliveInFlight = false;
  uint32_t failures = 0;
  uint64_t generation = 0;  // a keepalive scheduled for an earlier lease does nothing
  std::unordered_set<Holder*> holders;
  kj::TaskSet tasks{*this};  // last: its work refers to the members above
};

}  // namespace troupe::resolver_detail
