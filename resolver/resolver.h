#pragma once
// Resolver: where endpoints are published and found. Implementations: FixedResolver (a static
// table), and later the registry client and etcd.

#include <string>
#include <vector>

#include <kj/async.h>
#include <kj/string.h>
#include <kj/time.h>

#include "troupe/actor/endpoint.h"

namespace troupe {

enum class JobState : uint8_t {
  RUNNING,  // replicas may register; a job a resolver has not heard of is RUNNING
  ENDED,    // its endpoints are gone and its registrations are refused with JOB_ENDED
};

// "running", "ended".
kj::StringPtr toString(JobState state);

struct JobStatus {
  std::string jobId;
  JobState state = JobState::RUNNING;
  std::string reason;  // why it ended, for people
  bool operator==(const JobStatus&) const = default;
};

// How a job stands, for people: "running" while it runs; for an ended job, the first word of its
// reason when that is a launcher's final phase (launchers' reasons start with it: "succeeded",
// "failed: replica 2 exited with status 1", "stopped: ...", "unschedulable: ..."), else "ended".
kj::StringPtr jobOutcome(const JobStatus& status);

// What a launcher says of a job it creates (Resolver::createJob), for job listings.
struct JobDescription {
  std::string launcher;   // its kind: "local", "slurm", ... (at most MAX_LAUNCHER_KIND_BYTES)
  uint32_t replicas = 0;  // how many replicas it runs
};

// A job as Resolver::jobs() lists it.
struct JobInfo {
  JobStatus status;
  std::string launcher;         // "" for a job no launcher created (replicas started by hand)
  uint32_t replicas = 0;        // how many replicas its launcher runs; 0 when unknown
  uint32_t ready = 0;           // replicas with an endpoint READY now (distinct task indices)
  uint32_t endpoints = 0;       // its endpoints registered now
  int64_t createdAtMillis = 0;  // wall clock (Unix epoch) it was created or first seen; 0 unknown
  int64_t endedAtMillis = 0;    // when it ended; 0 while it runs
  bool operator==(const JobInfo&) const = default;
};

struct WatchEvent {
  enum class Type : uint8_t {
    ADDED,      // a new endpoint under the prefix
    CHANGED,    // an endpoint's state, address or incarnation changed
    REMOVED,    // the endpoint is gone
    SYNCED,     // everything before this reflects the resolver's current view
    JOB_ENDED,  // a job whose endpoints fall under the prefix ended (after their REMOVED events)
  };
  Type type;
  Endpoint endpoint;  // for ADDED, CHANGED, REMOVED
  JobStatus job;      // for JOB_ENDED
};

// "ADDED", "CHANGED", "REMOVED", "SYNCED", "JOB_ENDED".
kj::StringPtr toString(WatchEvent::Type type);

// Whether endpoints of job `jobId` can fall under `prefix`: the prefix starts with "<jobId>/",
// or "<jobId>/" starts with the prefix. Watches report JOB_ENDED for exactly these jobs.
bool jobOverlapsPrefix(kj::StringPtr jobId, kj::StringPtr prefix);

// A stream of changes under one prefix, pushed by the resolver. Belongs to the loop thread of
// the resolver that made it; dropping it ends the watch.
class Watch {
public:
  virtual ~Watch() noexcept(false) = default;

  // The next event: first one ADDED per endpoint present when the watch started, then SYNCED,
  // then changes as they happen. Only one next() may be outstanding. A resolver that loses and
  // regains its backend reconciles (ADDED / REMOVED for what differs, then SYNCED again) rather
  // than ending the watch; a watch that cannot continue rejects with DISCONNECTED.
  virtual kj::Promise<WatchEvent> next() = 0;
};

// One published endpoint. Belongs to the loop thread of its resolver; dropping it removes the
// endpoint from the resolver.
class Registration {
public:
  virtual ~Registration() noexcept(false) = default;

  // Publishes a new state for the endpoint.
  virtual void setState(EndpointState state) = 0;

  // Resolves once the resolver has accepted the endpoint; rejects with its refusal (for
  // example INVALID_ARGUMENT for a name that breaks the rules).
  virtual kj::Promise<void> whenRegistered() = 0;
};

// A piece of one replica's output, as JobControl::readLog returns it.
struct LogPiece {
  std::string data;       // the bytes read, from the offset asked for
  uint64_t next = 0;      // the offset after them
  uint64_t size = 0;      // the log's size now (next == size: nothing more for now)
  uint32_t replicas = 0;  // how many replicas the job has
};

// The most one readLog returns, in bytes.
constexpr uint32_t MAX_LOG_PIECE_BYTES = 1 << 20;

// One replica of a job as its launcher sees it (JobControl::describe).
struct ReplicaDetail {
  uint32_t index = 0;
  std::string state;  // "waiting", "running", or how it last ended ("exited with status 0")
  int pid = 0;        // of the running process; 0 when none runs (or not the launcher's)
  std::string host;   // where it runs or last ran; "" when not known
  uint32_t restarts = 0;
};

// A job as its launcher sees it: the dashboard's job page.
struct JobDetail {
  std::vector<ReplicaDetail> replicas;
  std::string resources;  // what each replica was given, for people
  std::string phase;      // the launcher's phase: "pending", "running", "succeeded", ...
};

// What the launcher that owns a job does for others, through the resolver (Resolver::stopJob,
// readJobLog): `troupe stop` and `troupe logs` from any machine. Loop thread of its launcher.
class JobControl {
public:
  virtual ~JobControl() noexcept(false) = default;
  // Stops the job (JobHandle::terminate); resolves once it ended.
  virtual kj::Promise<void> stop(kj::Duration grace) = 0;
  // Up to `maxBytes` (at most MAX_LOG_PIECE_BYTES) of replica `replica`'s output from byte
  // `offset`; INVALID_ARGUMENT for a replica the job does not have.
  virtual kj::Promise<LogPiece> readLog(uint32_t replica, uint64_t offset, uint32_t maxBytes) = 0;
  // The job's replicas and resources now.
  virtual kj::Promise<JobDetail> describe() = 0;
};

// A JobControl offered through a resolver (Resolver::serveJobControl): served until dropped.
class JobControlOffer {
public:
  virtual ~JobControlOffer() noexcept(false) = default;
};

// Belongs to the loop it was made on.
class Resolver {
public:
  virtual ~Resolver() noexcept(false) = default;

  // The endpoints whose names start with `prefix`, sorted by name. Throws INVALID_ARGUMENT for
  // a malformed prefix (see validatePrefix).
  virtual kj::Promise<kj::Array<Endpoint>> resolve(kj::StringPtr prefix) = 0;

  // Watches endpoints whose names start with `prefix`.
  virtual kj::Own<Watch> watch(kj::StringPtr prefix) = 0;

  // Publishes `endpoint` (its name must be a valid endpoint name) until the returned object is
  // dropped. Its whenRegistered() rejects with JOB_ENDED when the endpoint's job has ended.
  virtual kj::Own<Registration> registerEndpoint(Endpoint endpoint) = 0;

  // The job's state as the resolver knows it (RUNNING for a job it has not heard of).
  virtual kj::Promise<JobStatus> jobStatus(kj::StringPtr jobId) = 0;

  // Records a job's state; launchers call this with the credential createJob() gave them.
  // Ending a job removes its endpoints (watches see REMOVED for each, then JOB_ENDED) and refuses
  // its registrations with JOB_ENDED until the job is set RUNNING again. Throws INVALID_ARGUMENT
  // for a bad job id; rejects with PERMISSION_DENIED when the job was created and
  // `jobCredential` is not its credential. A reason longer than MAX_JOB_REASON_BYTES is cut.
  virtual kj::Promise<void> setJobStatus(JobStatus status, std::string jobCredential = {}) = 0;

  // Creates the job `jobId` (RUNNING) for the caller, a launcher, and resolves with its
  // credential: only holders may register under "<jobId>/" or set its state (SECURITY.md). The
  // launcher hands the credential to the job's replicas (Credentials' job token). Rejects with
  // JOB_ALREADY_EXISTS while a job of that name is live anywhere: created (by any launcher or
  // process) and not yet ended by its owner, or open with endpoints registered. The name may be
  // created again once the job ended.
  // `description` is what jobs() reports of it.
  virtual kj::Promise<std::string> createJob(kj::StringPtr jobId,
                                             JobDescription description = {}) = 0;

  // Every job the resolver knows, sorted by id: created, claimed or ended ones (as many as it
  // remembers) and open ones with endpoints. A job nothing is known of but its endpoints shows
  // RUNNING with an empty launcher.
  virtual kj::Promise<kj::Array<JobInfo>> jobs() = 0;

  // Serves `control` for job `jobId` (created with `jobCredential`) to stopJob() and
  // readJobLog() callers anywhere, until the offer is dropped; `logLocation` ("host:/path") is
  // where the job's logs lie, for when its launcher is gone. A resolver that cannot relay
  // (fixed, etcd) returns null: the job is then stopped and its logs read where it runs.
  virtual kj::Maybe<kj::Own<JobControlOffer>> serveJobControl(kj::StringPtr jobId,
                                                              std::string jobCredential,
                                                              std::string logLocation,
                                                              kj::Own<JobControl> control);

  // Has the launcher of job `jobId` stop it (JobControl::stop); resolves once it ended.
  // `credential` is the job's, or the resolver's administrator token. Rejects with
  // PERMISSION_DENIED for any other credential, JOB_ENDED (with its reason) for a job that had
  // ended, UNREACHABLE when no launcher serves the job (the message says where its logs lie),
  // UNIMPLEMENTED for a resolver that cannot relay.
  virtual kj::Promise<void> stopJob(kj::StringPtr jobId, kj::Duration grace,
                                    std::string credential);

  // JobControl::readLog of job `jobId`'s launcher. Rejects with INVALID_ARGUMENT for a job the
  // resolver does not know, UNREACHABLE when no launcher serves it, UNIMPLEMENTED as stopJob().
  virtual kj::Promise<LogPiece> readJobLog(kj::StringPtr jobId, uint32_t replica, uint64_t offset,
                                           uint32_t maxBytes);
};

// The longest launcher kind (JobDescription::launcher) resolvers keep, in bytes; a longer one is
// cut at a character boundary (cutLauncherKind).
constexpr size_t MAX_LAUNCHER_KIND_BYTES = 64;
std::string cutLauncherKind(const std::string& launcher);

// The longest reason a resolver keeps for an ended job, in bytes; a longer one is cut at a
// character boundary and ends in "...".
constexpr size_t MAX_JOB_REASON_BYTES = 1024;

// `reason` as resolvers keep it: at most MAX_JOB_REASON_BYTES, cut at a UTF-8 character boundary
// and ending in "..." when it was longer.
std::string cutJobReason(const std::string& reason);

// The longest job credential a resolver accepts, in bytes (createJob() makes 64); a longer one is
// refused with INVALID_ARGUMENT.
constexpr size_t MAX_JOB_CREDENTIAL_BYTES = 256;

// The longest prefix (and endpoint name) resolvers accept, in bytes.
constexpr size_t MAX_PREFIX_LENGTH = 2 * MAX_NAME_LENGTH + 16;

// Throws INVALID_ARGUMENT unless `prefix` is at most MAX_PREFIX_LENGTH bytes of printable ASCII
// without spaces. The empty prefix (everything) is valid.
void validatePrefix(kj::StringPtr prefix);

}  // namespace troupe
