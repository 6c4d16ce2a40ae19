#pragma once
// One endpoint registered in etcd: a key on its client's lease (EtcdSession), written again when
// the lease or the key is lost, deleted when dropped.

#include <cstdint>
#include <string>

#include <kj/async.h>

#include "troupe/resolver/detail/etcd_client.h"
#include "troupe/resolver/detail/etcd_session.h"
#include "troupe/resolver/resolver.h"

namespace troupe::resolver_detail {

// What etcd holds about a job, read in the transaction that decides a write.
struct EtcdJobRecord {
  bool exists = false;
  int64_t modRevision = 0;
  JobState state = JobState::RUNNING;
  std::string reason;
  std::string owner;  // hash of the credential; empty while open
  JobDescription description;
  int64_t createdAtMillis = 0;
  int64_t endedAtMillis = 0;
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

class EtcdRegistration final : public Registration,
                               private EtcdSession::Holder,
                               private kj::TaskSet::ErrorHandler {
public:
  EtcdRegistration(kj::Own<EtcdClient> client, Endpoint endpoint);
  ~EtcdRegistration() noexcept(false);
  KJ_DISALLOW_COPY(EtcdRegistration);

  void setState(EndpointState state) override;
  kj::Promise<void> whenRegistered() override;

private:
  enum class Phase : uint8_t { REGISTERING, HELD, STOPPED };

  // Takes the session's lease and writes the key; on failure retries with backoff or stops, as
  // failed() decides.
  void attempt();
  kj::Promise<void> write(uint32_t tries);
  // The revision of the entry `range` holds under this registration's key, 0 for none. Throws
  // NAME_TAKEN when it is another registration's, of the same or a newer incarnation.
  int64_t heldAt(schema::etcd::RangeResponse::Reader range);
  // Sends a write transaction, remembered until answered so that a drop can wait for it.
  kj::Promise<bool> send(kj::String txn);
  void failed(kj::Exception&& e);
  void held();
  // Rewrites the value (a new state) if the key is still on this registration's lease.
  kj::Promise<void> rewrite();
  void taskFailed(kj::Exception&& exception) override;
  const std::string& heldKey() const override { return key; }
  void lost(int64_t lease, kj::StringPtr why) override;

  kj::Own<EtcdClient> client;
  EtcdSession& session;
  Endpoint endpoint;
  std::string key;
  Phase phase = Phase::REGISTERING;
  bool everRegistered = false;
  int64_t lease = 0;      // the lease its key was last written on; 0: none
  int64_t writtenAt = 0;  // the revision of its last write
  uint32_t failures = 0;
  uint64_t generation = 0;                        // callbacks of an earlier attempt do nothing
  kj::Maybe<kj::ForkedPromise<int64_t>> writing;  // the last write sent: its revision, 0 if refused
  kj::ForkedPromise<void> registered;
  kj::Own<kj::PromiseFulfiller<void>> registeredFulfiller;
  kj::TaskSet tasks{*this};  // last: its work refers to the members above
};

}  // namespace troupe::resolver_detail
