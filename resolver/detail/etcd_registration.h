#pragma once
// One endpoint registered in etcd: a key on a lease, kept alive, written again when the lease is
// lost, revoked when dropped.

#include <cstdint>
#include <string>

#include <kj/async.h>

#include "troupe/resolver/detail/etcd_client.h"
#include "troupe/resolver/resolver.h"

namespace troupe::resolver_detail {

// What etcd holds about a job, read in the transaction that decides a write.
struct EtcdJobRecord {
  bool exists = false;
  int64_t modRevision = 0;
  JobState state = JobState::RUNNING;
  std::string reason;
  std::string owner;  // hash of the credential; empty while open
};

// SHA-256 of `credential`, in hex: what a job's record keeps instead of the credential itself.
std::string credentialDigest(kj::ArrayPtr<const kj::byte> credential);

// Throws PERMISSION_DENIED unless `credential` may act for `job` (an open job: anyone), and
// INVALID_ARGUMENT for a credential over MAX_JOB_CREDENTIAL_BYTES.
void authorizeJob(const EtcdJobRecord& job, kj::StringPtr jobId,
                  kj::ArrayPtr<const kj::byte> credential, kj::StringPtr what);

// The job record in a range response's first kv (or none).
EtcdJobRecord jobRecordFrom(EtcdClient& client, kj::StringPtr jobId,
                            schema::etcd::RangeResponse::Reader range);

// A compare that holds while `key` is attached to `lease`.
void compareHeld(schema::etcd::Compare::Builder compare, const std::string& key, int64_t lease);

// A compare that holds while `job` is as read: same mod revision, or still absent.
void compareUnchanged(schema::etcd::Compare::Builder compare, const std::string& key,
                      int64_t modRevision);

class EtcdRegistration final : public Registration, private kj::TaskSet::ErrorHandler {
public:
  EtcdRegistration(kj::Own<EtcdClient> client, Endpoint endpoint);
  ~EtcdRegistration() noexcept(false);
  KJ_DISALLOW_COPY(EtcdRegistration);

  void setState(EndpointState state) override;
  kj::Promise<void> whenRegistered() override;

private:
  enum class Phase : uint8_t { REGISTERING, HELD, STOPPED };

  // Grants a lease (unless one is held) and writes the key; on failure retries with backoff or
  // stops, as failed() decides.
  void attempt();
  kj::Promise<void> grantAndWrite();
  kj::Promise<void> write(uint32_t tries);
  // Refreshes the lease, then checks that the key is still this lease's.
  kj::Promise<void> refresh();
  void failed(kj::Exception&& e);
  void scheduleRefresh();
  // A refresh of attempt `gen` succeeded: the next is scheduled.
  void refreshed(uint64_t gen);
  // Rewrites the value (a new state) if the key is still this lease's.
  kj::Promise<void> rewrite();
  void taskFailed(kj::Exception&& exception) override;
  // Revokes the lease held, if any, in the background.
  void revokeLease();

  kj::Own<EtcdClient> client;
  Endpoint endpoint;
  std::string key;
  Phase phase = Phase::REGISTERING;
  bool everRegistered = false;
  int64_t lease = 0;  // 0: none held
  uint32_t failures = 0;
  uint64_t generation = 0;  // callbacks of an earlier attempt do nothing
  kj::ForkedPromise<void> registered;
  kj::Own<kj::PromiseFulfiller<void>> registeredFulfiller;
  kj::TaskSet tasks{*this};  // last: its work refers to the members above
};

}  // namespace troupe::resolver_detail
