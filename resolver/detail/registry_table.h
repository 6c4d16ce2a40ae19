#pragma once
// The state behind a RegistryServer: entries with their leases and deadlines, watchers with
// their queues, and job states. The Cap'n Proto objects (Registry, Lease, WatchHandle) are thin
// wrappers that call into it.

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>

#include <kj/async.h>
#include <kj/refcount.h>

#include "troupe/base/event_loop.h"
#include "troupe/resolver/registry_server.h"
#include "troupe/resolver/resolver.h"
#include "troupe/schemas/registry.capnp.h"

namespace troupe::resolver_detail {

// Something that happened to a job, for its history on the dashboard.
struct JobEvent {
  std::string jobId;
  int64_t atMillis = 0;  // wall clock (Unix epoch)
  std::string text;      // "created by a local launcher, 2 replicas", "w-0 ready", ...
};

// How many job events a registry keeps, over every job together (the oldest go first), each in
// a fixed record of JOB_EVENT_BYTES (its job id and text, cut to fit): 3.2 MB in one block,
// allocated at the first event, so that events never scatter small allocations over the heap
// (which would keep it from shrinking after many endpoints went).
constexpr size_t MAX_JOB_EVENTS = 10'000;
constexpr size_t JOB_EVENT_BYTES = 320;

// What an endpoint costs a registry to keep, in bytes: its name, address and metadata keys and
// values (the parts of the name that are repeated in jobId and actor are not counted again).
size_t endpointBytes(const Endpoint& endpoint);

// Shared (kj::addRef) by the RegistryServer and every capability it handed out, so that a
// capability outliving the server finds the table shut down rather than dangling. Loop thread
// only.
class RegistryTable final : public kj::Refcounted, private kj::TaskSet::ErrorHandler {
public:
  RegistryTable(EventLoop& loop, const RegistryServerOptions& options,
                std::shared_ptr<spdlog::logger> log);
  ~RegistryTable() noexcept(false);
  KJ_DISALLOW_COPY(RegistryTable);

  struct Granted {
    uint64_t leaseId;  // identifies this registration's lease for renew/setState/release
    kj::Duration ttl;  // the TTL granted
  };

  // Validates and publishes `endpoint` (jobId, actor and taskIndex are filled in from its name;
  // the address is stored in canonical form). Throws INVALID_ARGUMENT, PERMISSION_DENIED,
  // JOB_ENDED or NAME_TAKEN (see registry.capnp), and DISCONNECTED after shutdown().
  Granted add(Endpoint endpoint, uint32_t ttlMillis, kj::ArrayPtr<const kj::byte> jobCredential);

  // Extends the lease's deadline and returns its TTL. Throws LEASE_LOST when `leaseId` no longer
  // holds `name`.
  kj::Duration renew(kj::StringPtr name, uint64_t leaseId);

  // Publishes a new state for the lease's entry. Throws like renew().
  void setState(kj::StringPtr name, uint64_t leaseId, EndpointState state);

  // The Lease capability was released: removes the entry if `leaseId` still holds it.
  void release(kj::StringPtr name, uint64_t leaseId);

  // Entries under `prefix`, sorted by name. Throws INVALID_ARGUMENT for a malformed prefix.
  kj::Array<Endpoint> resolve(kj::StringPtr prefix);

  // Adds a watcher and queues its snapshot (ADDED per entry, then SYNCED). Returns its id.
  uint64_t addWatcher(kj::StringPtr prefix, schema::Watcher::Client watcher);

  // Forgets the watcher (its WatchHandle was released). A batch in flight completes unheeded.
  void removeWatcher(uint64_t id);

  JobStatus jobStatus(kj::StringPtr jobId);
  // Throws PERMISSION_DENIED without the job's credential (registry.capnp).
  void setJobStatus(JobStatus status, kj::ArrayPtr<const kj::byte> jobCredential);

  // Creates the job (registry.capnp, createJob) and returns its credential; throws
  // JOB_ALREADY_EXISTS while it is live.
  std::string createJob(kj::StringPtr jobId, JobDescription description);

  // serveJobControl (registry.capnp): keeps `control` for the job, replacing any before.
  // Throws PERMISSION_DENIED unless the job was created and `presented` is its credential.
  void setControl(const std::string& jobId, kj::ArrayPtr<const kj::byte> presented,
                  schema::JobControl::Client control, std::string logLocation);

  // The control to relay stopJob to: throws PERMISSION_DENIED unless `presented` is the job's
  // credential or the administrator token, JOB_ENDED for an ended job, UNREACHABLE when no
  // launcher serves it.
  schema::JobControl::Client controlToStop(const std::string& jobId,
                                           kj::ArrayPtr<const kj::byte> presented);

  // The control to relay readJobLog to: throws INVALID_ARGUMENT for a job it does not know,
  // UNREACHABLE when no launcher serves it.
  schema::JobControl::Client controlToRead(const std::string& jobId);

  // A call relayed to the job's launcher failed with DISCONNECTED: forgets its control, so the
  // next one says the launcher is gone. Returns that message.
  kj::String controlLost(const std::string& jobId);

  // Forgets everything; later calls throw DISCONNECTED.
  void shutdown();

  size_t endpointCount() const { return entries.size(); }
  size_t watcherCount() const { return watchers.size(); }
  size_t queuedEventBytes() const { return queuedBytes; }

  // Every job it knows, sorted by id: those with endpoints (running unless they ended) and those
  // created, claimed or ended.
  kj::Array<JobInfo> jobList() const;

  // What happened to job `jobId` lately (at most MAX_JOB_EVENTS over all jobs), oldest first.
  std::vector<JobEvent> jobEvents(kj::StringPtr jobId) const;

  // The job's entry in jobList(), or null when the registry does not know it.
  kj::Maybe<JobInfo> jobInfo(kj::StringPtr jobId) const;

  // Where job `jobId`'s logs lie ("host:/path"), "" when not known.
  std::string logLocation(kj::StringPtr jobId) const;

  // The entry named exactly `name`, or null.
  kj::Maybe<const Endpoint&> find(kj::StringPtr name) const;

  // Adds its series (endpoints by state, leases, watchers, jobs, events, registrations) to `out`.
  void collectMetrics(MetricsSnapshot& out) const;

  // A registration refused with `code` (counted by RegistryServer, which sees every refusal).
  void countRefusal(ErrorCode code) { refusals.countError(code); }

private:
  struct Entry {
    Endpoint endpoint;
    uint64_t leaseId;
    kj::Duration ttl;
    kj::TimePoint deadline;
  };

  struct Watcher {
    std::string prefix;
    schema::Watcher::Client client;
    std::deque<WatchEvent> queue;
    bool sending = false;
    size_t queuedBytes = 0;   // of `queue`
    size_t sendingBytes = 0;  // of the events() call not yet answered
  };

  // A job someone created, claimed or ended.
  struct Job {
    std::string credential;       // empty while the job is open (anyone may act for it)
    kj::Maybe<JobStatus> ended;   // how it ended; null while it runs
    uint64_t endedSeq = 0;        // its key in endedOrder while it has ended
    JobDescription description;   // what its launcher said of it
    int64_t createdAtMillis = 0;  // wall clock: created, or first claimed or ended
    int64_t endedAtMillis = 0;    // wall clock, while it has ended
    // What its launcher serves for stopJob and readJobLog, while it does; where its logs lie.
    kj::Maybe<schema::JobControl::Client> control;
    std::string logLocation;
  };

  // "job 'x' has no launcher to reach...", for UNREACHABLE.
  kj::String noLauncher(const std::string& jobId, const Job& job) const;

  void taskFailed(kj::Exception&& exception) override;
  void checkRunning() const;

  // Checks `presented` against the job's credential before `what` (throws PERMISSION_DENIED).
  void authorize(const std::string& jobId, kj::ArrayPtr<const kj::byte> presented,
                 kj::StringPtr what);
  // Once `what` was granted: an open job is claimed by a non-empty `presented`.
  void claimIfOpen(const std::string& jobId, kj::ArrayPtr<const kj::byte> presented,
                   kj::StringPtr what);
  bool hasEndpoints(kj::StringPtr jobId) const;
  // The job's entry in jobList() as its record alone says it (ready and endpoints uncounted).
  static JobInfo recordInfo(const std::string& id, const Job& job);
  // The job's record, made when absent; throws OVERLOADED when the registry knows maxJobs jobs
  // and none has ended (the oldest ended one is forgotten to make room).
  Job& jobRecord(const std::string& jobId, kj::StringPtr what);
  void markEnded(const std::string& jobId, Job& job, JobStatus status);
  void markRunning(Job& job);
  int64_t nowMillis() const;

  // Looks up the entry `leaseId` holds; throws LEASE_LOST when it holds none.
  Entry& leased(kj::StringPtr name, uint64_t leaseId, kj::StringPtr what);
  // Throws (and logs) what refuses `endpoint`'s registration, filling its job, actor and task
  // index from its name and normalizing its address; claims its job when unowned and nothing
  // refuses it.
  void checkRegistration(Endpoint& endpoint, kj::ArrayPtr<const kj::byte> jobCredential);

  void setDeadline(Entry& entry, kj::TimePoint deadline);
  void erase(std::map<std::string, Entry, std::less<>>::iterator it, kj::StringPtr why);
  void armTimer();
  void expire();

  void notify(WatchEvent::Type type, const Endpoint& endpoint);
  void recordEvent(kj::StringPtr jobId, kj::String text);
  void push(uint64_t id, Watcher& watcher, WatchEvent event);
  void send(uint64_t id, Watcher& watcher);
  void dropWatcher(uint64_t id, kj::StringPtr why, bool expected = false);
  // Cuts off the watchers furthest behind until the queued bytes fit maxQueuedEventBytes.
  void shedWatchers();
  // Entries went: gives freed memory back to the system now and then (see erase()).
  void trimLater();

  EventLoop& loop;
  const RegistryServerOptions options;
  std::shared_ptr<spdlog::logger> log;
  bool running = true;

  std::map<std::string, Entry, std::less<>> entries;
  std::map<uint64_t, std::string> leaseNames;              // live leases -> their entry
  std::set<std::pair<kj::TimePoint, uint64_t>> deadlines;  // (deadline, leaseId)
  uint64_t nextLeaseId = 1;
  kj::Maybe<kj::TimePoint> timerAt;  // when the armed expiry timer fires
  uint64_t timerGeneration = 0;      // timers armed earlier than the last one do nothing

  std::map<uint64_t, Watcher> watchers;
  uint64_t nextWatcherId = 1;
  size_t queuedBytes = 0;  // over every watcher, queued and sending

  // What the registry did, for its metrics.
  uint64_t registrations = 0;  // accepted
  CallOutcomes refusals;       // registrations refused, by code
  uint64_t expiredCount = 0;
  uint64_t eventsPushed = 0;
  uint64_t watchersDropped = 0;

  uint64_t erasedSinceTrim = 0;
  bool trimQueued = false;

  std::map<std::string, Job, std::less<>> jobs;  // created, claimed or ended
  std::map<uint64_t, std::string> endedOrder;    // ended jobs, oldest first
  uint64_t nextEndedSeq = 1;
  struct EventRecord {
    int64_t atMillis;
    uint16_t jobBytes;   // the job id's, first in `text`
    uint16_t textBytes;  // what follows it
    char text[JOB_EVENT_BYTES - 12];
  };
  static_assert(sizeof(EventRecord) == JOB_EVENT_BYTES);
  std::vector<EventRecord> events;  // every job's: a ring of MAX_JOB_EVENTS, oldest at nextEvent
  size_t nextEvent = 0;

  kj::Own<kj::TaskSet> tasks;  // expiry timers, events() calls in flight
};

}  // namespace troupe::resolver_detail
