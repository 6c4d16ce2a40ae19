#pragma once
// FixedResolver: a table of endpoints kept in memory, filled from a `fixed:` spec, a file or
// code, that also takes this process's own registrations. For tests, single-machine jobs and
// clusters whose addresses are known up front.

#include <kj/array.h>
#include <kj/memory.h>

#include "troupe/resolver/resolver.h"

namespace troupe {

namespace resolver_detail {
class FixedTable;
}

// Endpoints keyed by name; every endpoint's name is a valid endpoint name (parseEndpointName)
// and its jobId, actor and taskIndex are the parts of that name.
//
// Single-threaded: the resolver, the watches and registrations it hands out and the promises
// they return are all used on one thread, the one whose event loop (a troupe::EventLoop) waits
// on those promises. Nothing here blocks except fromFile(), which reads its file synchronously.
// The factories return a resolver the caller owns.
//
// Watches and registrations borrow the resolver's table while it lives; dropping either one
// unhooks it from the table. The resolver may be destroyed before them: a watch then still
// delivers the events it had queued, after which next() rejects with DISCONNECTED (a next()
// pending at that moment rejects at once); a registration's setState() and its destruction then
// do nothing. No events are sent for the endpoints that vanish with the resolver.
class FixedResolver final : public Resolver {
public:
  // An empty table.
  FixedResolver();

  // A table holding copies of `endpoints`, each taken as add() takes it (a later entry replaces
  // an earlier one of the same name). Borrows `endpoints` only for the call. Throws
  // INVALID_ARGUMENT for an entry whose name breaks the endpoint-name rules.
  explicit FixedResolver(kj::ArrayPtr<const Endpoint> endpoints);

  // Ends the watches and detaches the registrations it handed out (see above).
  ~FixedResolver() noexcept(false);

  KJ_DISALLOW_COPY(FixedResolver);

  // Builds a table from the body of a `fixed:` URL: `NAME=ADDRESS,NAME=ADDRESS,...`, for example
  // `job-1/ps-0=tcp://127.0.0.1:4000,job-1/ps-1=unix:/tmp/ps1.sock`. Spaces and tabs around an
  // entry and around its '=' are ignored. Each NAME must be a valid endpoint name, each ADDRESS one
  // Address::parse() accepts (it is stored in Address::toString() form); endpoints are READY with
  // incarnation 0 and no metadata. The empty spec is the empty table. Throws INVALID_ARGUMENT
  // naming the offending entry (by position and text) for an empty entry, an entry without '=', a
  // bad name, a bad address or a name given twice.
  static kj::Own<FixedResolver> parse(kj::StringPtr spec);

  // Builds a table from the text of a fixed-resolver file, one endpoint per line:
  //
  //     NAME ADDRESS [STATE] [KEY=VALUE ...]
  //
  // Fields are separated by spaces or tabs; `#` starts a comment that runs to the end of the
  // line (so values cannot contain '#'); blank lines are ignored; "\r\n" line ends are accepted.
  // NAME and ADDRESS are as in parse(); STATE is `starting`, `ready` or `draining` (default
  // ready); KEY=VALUE pairs become metadata (KEY non-empty, VALUE may be empty). Incarnation is
  // 0. Throws INVALID_ARGUMENT "<sourceName>:<line>: <reason>" for the first bad line (too few
  // fields, bad name, bad address, unknown state, malformed or repeated key, repeated name).
  // Borrows `text` and `sourceName` only for the call.
  static kj::Own<FixedResolver> parseFile(kj::StringPtr text, kj::StringPtr sourceName);

  // Reads the file at `path` (synchronously, so call it at startup rather than from a handler)
  // and parses it as parseFile(contents, path) does. A file that cannot be opened or read throws
  // INVALID_ARGUMENT naming `path` and the OS's reason.
  static kj::Own<FixedResolver> fromFile(kj::StringPtr path);

  // Stores `endpoint` under its name, replacing any entry of that name (including one published
  // by a registration, which then no longer owns it: dropping that registration leaves this
  // entry). jobId, actor and taskIndex are overwritten with the parts of the name; the address
  // is stored as given. Watches see ADDED for a new name, CHANGED when the entry differs from
  // the one replaced, nothing when it is identical. Throws INVALID_ARGUMENT, changing nothing,
  // when the name breaks the endpoint-name rules.
  void add(Endpoint endpoint);

  // Deletes the entry called `name` (watches see REMOVED) and returns true; false when there is
  // none. A registration that published the entry is not told; its setState() then does nothing.
  bool remove(kj::StringPtr name);

  // The entries whose names start with `prefix`, sorted by name, as copies in an already
  // resolved promise. Throws INVALID_ARGUMENT when validatePrefix() refuses `prefix`.
  kj::Promise<kj::Array<Endpoint>> resolve(kj::StringPtr prefix) override;

  // A watch over the names starting with `prefix` (copied). Its first events are ADDED for each
  // current entry under the prefix, sorted by name, then SYNCED; after that ADDED, CHANGED and
  // REMOVED follow every add(), remove(), registration, Registration::setState() and dropped
  // registration that touches the prefix, in the order they happened. Events queue without
  // limit until next() takes them, so none are lost while nobody waits. next() throws FAILED
  // (a broken contract) when called while an earlier next() promise is still pending; dropping
  // a pending next() promise cancels only the wait, not the next event. Dropping the watch
  // unhooks it. Throws INVALID_ARGUMENT when validatePrefix() refuses `prefix`.
  kj::Own<Watch> watch(kj::StringPtr prefix) override;

  // Publishes `endpoint` as add() does and returns its registration. For a valid name the
  // registration's whenRegistered() is already resolved, setState() stores the new state
  // (watches see CHANGED when it differs), and dropping it removes the entry (watches see
  // REMOVED) unless add(), remove() or another registration of the same name has since taken
  // the entry over, in which case setState() and dropping leave the entry alone. For a name that
  // breaks the rules nothing is stored, whenRegistered() rejects with INVALID_ARGUMENT, and
  // setState() and dropping do nothing.
  kj::Own<Registration> registerEndpoint(Endpoint endpoint) override;

  // Job states, kept in memory as resolver.h describes: ending a job removes its entries (watches
  // see REMOVED for each, then JOB_ENDED), and add() throws, and registrations are refused with,
  // JOB_ENDED until the job is set RUNNING again. Both resolve at once; both throw
  // INVALID_ARGUMENT for a bad job id.
  // createJob() refuses with JOB_ALREADY_EXISTS a job it created that has not ended, or one
  // with entries, and setJobStatus() a created job's state without its credential with
  // PERMISSION_DENIED (registrations, made in this process, need none).
  kj::Promise<JobStatus> jobStatus(kj::StringPtr jobId) override;
  kj::Promise<void> setJobStatus(JobStatus status, std::string jobCredential = {}) override;
  kj::Promise<std::string> createJob(kj::StringPtr jobId, JobDescription description = {}) override;

  // The jobs created here or ended, and those of the entries (Resolver::jobs()); at once.
  kj::Promise<kj::Array<JobInfo>> jobs() override;

private:
  kj::Own<resolver_detail::FixedTable> table;
  std::map<std::string, std::string> created;  // jobs createJob() made -> their credentials
  std::map<std::string, JobInfo> records;      // and what their launchers said of them
};

}  // namespace troupe
