#pragma once
// Watches of an EtcdResolver: one etcd watch on "<root>/" per client (the hub), feeding every
// local Watch whose prefix an event falls under.

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <kj/async.h>
#include <kj/list.h>

#include "troupe/resolver/detail/etcd_client.h"
#include "troupe/resolver/detail/watch_queue.h"
#include "troupe/resolver/resolver.h"

namespace troupe::resolver_detail {

// One key's change, as the hub read it from etcd.
struct EtcdChange {
  enum class Kind : uint8_t { PUT, DELETE, JOB_ENDED };
  Kind kind;
  int64_t revision;
  std::string name;   // the endpoint's name (PUT, DELETE)
  Endpoint endpoint;  // PUT
  JobStatus job;      // JOB_ENDED
};

// Everything under the root at one revision.
struct EtcdSnapshot {
  int64_t revision = 0;
  std::map<std::string, Endpoint> endpoints;
  std::map<std::string, JobStatus> endedJobs;
};

// Decodes an endpoint value read from `key` ("<root>/endpoints/<name>"); null (after a warning)
// for a value that is not troupe's.
kj::Maybe<Endpoint> decodeEndpoint(EtcdClient& client, kj::StringPtr key,
                                   capnp::Data::Reader value);
// A job's value as troupe writes it under "<root>/jobs/<job id>".
struct EtcdJobValue {
  JobStatus status;
  std::string owner;  // SHA-256 of the job's credential, in hex; empty while the job is open
  JobDescription description;
  int64_t createdAtMillis = 0;
  int64_t endedAtMillis = 0;
};

// Decodes a job value; null (after a warning) for one that is not troupe's, which counts as an
// open, running job.
kj::Maybe<EtcdJobValue> decodeJob(EtcdClient& client, kj::StringPtr jobId,
                                  capnp::Data::Reader value);

// The endpoints under `prefix` (an endpoint-name prefix), sorted by name, and the revision they
// were read at. The promise holds a reference to `client`.
struct EtcdEndpoints {
  int64_t revision = 0;
  kj::Array<Endpoint> endpoints;
};
kj::Promise<EtcdEndpoints> readEndpoints(EtcdClient& client, kj::StringPtr prefix);

class EtcdWatch final : public Watch {
public:
  EtcdWatch(kj::Own<EtcdClient> client, std::string prefix);
  ~EtcdWatch() noexcept(false);
  KJ_DISALLOW_COPY(EtcdWatch);

  kj::Promise<WatchEvent> next() override { return queue.next(); }

  // From the hub: everything under the root at a revision: reports what differs from what this
  // watch has reported, then SYNCED (always when `afterBreak`: the hub's stream broke).
  void reconcile(const EtcdSnapshot& snapshot, bool afterBreak);
  // From the hub: changes read from the stream, in order.
  void apply(const std::vector<EtcdChange>& changes);

  const std::string prefix;
  kj::ListLink<EtcdWatch> link;

private:
  void applyOne(const EtcdChange& change);
  kj::Promise<void> start();

  kj::Own<EtcdClient> client;
  WatchQueue queue;
  bool started = false;                  // the first snapshot is in
  int64_t since = 0;                     // changes up to this revision are reflected
  std::vector<EtcdChange> pending;       // changes that came before the first snapshot
  std::map<std::string, Endpoint> view;  // what this watch has reported, by name
  uint32_t failures = 0;
  kj::Promise<void> starting = nullptr;  // last: refers to the members above
};

// Owned by the EtcdClient; runs while it has watches.
class EtcdWatchHub {
public:
  explicit EtcdWatchHub(EtcdClient& client) : client(client) {}
  ~EtcdWatchHub() noexcept(false);
  KJ_DISALLOW_COPY(EtcdWatchHub);

  void add(EtcdWatch& watch);
  void remove(EtcdWatch& watch);

  // Reads everything under the root: a snapshot at the range's revision.
  kj::Promise<EtcdSnapshot> readAll();
  // The changes in one object of the watch stream (endpoint changes first, then job ends).
  std::vector<EtcdChange> changesIn(schema::etcd::WatchResponse::Reader response);

private:
  kj::Promise<void> run();
  kj::Promise<void> follow(kj::Own<EtcdStream> stream);
  // Fails once requests have moved off the stream's member (it died or froze: a frozen member
  // keeps a stream open and silent), asking etcd something small now and then so that they do.
  kj::Promise<void> watchdog(size_t member);
  kj::Promise<void> retryLater(kj::Exception&& why);

  EtcdClient& client;
  kj::List<EtcdWatch, &EtcdWatch::link> watches;
  int64_t revision = 0;  // read up to here
  uint32_t failures = 0;
  bool broke = false;                   // the stream broke since the last read of everything
  kj::Promise<void> running = nullptr;  // last: refers to the members above
};

}  // namespace troupe::resolver_detail
