@0xa715d8f9d386bce9;
# The registry: troupe's embedded default resolver, a small Cap'n Proto service. Stable: fields
# are only ever added, at new ordinals.

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("troupe::schema");

using Actor = import "/troupe/schemas/actor.capnp";

enum JobState {
  running @0;   # replicas may register (a job the registry has not heard of counts as running)
  ended @1;     # its endpoints are gone and registrations are refused
}

struct JobStatus {
  jobId @0 :Text;
  state @1 :JobState;
  reason @2 :Text;   # why it ended, for people ("completed", "failed: replica 3 exited 1", ...)
}

struct JobInfo {
  # A job as `listJobs` reports it.
  status @0 :JobStatus;
  launcher @1 :Text;        # "local", "slurm", ...; empty for a job no launcher created (open)
  replicas @2 :UInt32;      # how many replicas its launcher runs; 0 when unknown
  ready @3 :UInt32;         # replicas with an endpoint READY now (distinct task indices)
  endpoints @4 :UInt32;     # its endpoints registered now
  createdAtMillis @5 :Int64;  # wall clock (Unix epoch, ms) the job was created or first seen; 0 unknown
  endedAtMillis @6 :Int64;    # when it ended; 0 while it runs
}

struct WatchEvent {
  union {
    added @0 :Actor.Endpoint;
    changed @1 :Actor.Endpoint;    # state, address or incarnation changed
    removed @2 :Actor.Endpoint;
    synced @3 :Void;               # every event before this reflects the registry's view
    jobEnded @4 :JobStatus;        # a job whose endpoints fall under the watched prefix ended
  }
}

interface Watcher {
  # Implemented by the watching client; the registry pushes to it.
  events @0 (events :List(WatchEvent)) -> ();
  # Events in order. The registry sends the next batch only after this call returns, so a slow
  # watcher gets larger batches rather than an unbounded queue of calls.
}

interface WatchHandle {
  # Dropping it ends the watch.
}

interface Lease {
  # One registration. The entry lives while this capability is held and renewed: releasing it
  # (or losing the connection that holds it) removes the entry at once; missing renewals for
  # longer than the TTL removes it then.

  renew @0 () -> (ttlMillis :UInt32);
  # Extends the lease by its TTL. Fails with "troupe.lease_lost" once the entry is gone (expired,
  # replaced by a newer incarnation, or its job ended): register again.

  setState @1 (state :Actor.EndpointState) -> ();
  # Publishes a new state; fails like renew() once the entry is gone.
}

interface JobControl {
  # Served by the launcher that owns a job and handed to the registry (serveJobControl), which
  # relays `troupe stop` and `troupe logs` to it from any machine that reaches the registry.

  stop @0 (graceMillis :UInt32) -> ();
  # Stops the job as its launcher's terminate does (SIGTERM, SIGKILL after the grace); returns
  # once every replica exited and the job ended.

  readLog @1 (replica :UInt32, offset :UInt64, maxBytes :UInt32) -> (piece :LogPiece);
  # Up to `maxBytes` of replica `replica`'s output (stdout and stderr) from byte `offset`.

  describe @2 () -> (job :JobDetail);
  # The job's replicas as its launcher sees them, and what each was given (the dashboard's job
  # page).
}

struct ReplicaDetail {
  index @0 :UInt32;
  state @1 :Text;       # "running", "starting", "exited", "waiting" (to be started again)
  pid @2 :Int32;        # of the running process; 0 when none runs
  host @3 :Text;        # where it runs (or last ran); empty when not known
  restarts @4 :UInt32;  # how many times it was started again
}

struct JobDetail {
  replicas @0 :List(ReplicaDetail);
  resources @1 :Text;   # what each replica was given, for people ("2 CPUs, 4 GiB, 1 GPU")
  phase @2 :Text;       # the launcher's phase of the job: "pending", "running", "succeeded", ...
}

struct LogPiece {
  data @0 :Data;        # the bytes read, from the offset asked for
  next @1 :UInt64;      # the offset after them: where to read on
  size @2 :UInt64;      # the log's size now (next == size: nothing more for now)
  replicas @3 :UInt32;  # how many replicas the job has (valid indices: 0 .. replicas - 1)
}

interface Registry {
  # Jobs and their credentials: a job created with createJob is owned by whoever holds its
  # credential (the launcher, and the replicas it hands the credential to). Only a holder may
  # register under "<job>/" (and so replace an incarnation) or set the job's state; every
  # client may resolve and watch. A job nobody created is open: registrations without a
  # credential are taken, and the first registration or status that presents one claims the
  # job with it (how a registry that restarted learns its jobs' owners again).

  register @0 (endpoint :Actor.Endpoint, ttlMillis :UInt32, jobCredential :Data)
      -> (lease :Lease, ttlMillis :UInt32);
  # Publishes `endpoint` under its name. Refused with "troupe.invalid_argument" for a bad name or
  # an oversize entry, "troupe.permission_denied" without the job's credential,
  # "troupe.job_ended" when its job has ended, "troupe.name_taken" when another live lease
  # holds the name with the same or a newer incarnation, and "troupe.overloaded" when the
  # registry holds as many endpoints or jobs as it may (RegistryServerOptions: retry later). A newer incarnation replaces the entry
  # and revokes the old lease. A `ttlMillis` of 0 asks for the registry's default; the TTL
  # granted (clamped to the registry's bounds) comes back, and the registrant renews well within
  # it.

  resolve @1 (prefix :Text) -> (endpoints :List(Actor.Endpoint));
  # The endpoints whose names start with `prefix`, sorted by name.

  watch @2 (prefix :Text, watcher :Watcher) -> (handle :WatchHandle);
  # Pushes to `watcher`: `added` for each endpoint under the prefix, `synced`, then changes as
  # they happen (and `jobEnded` for jobs that end). Refused with "troupe.overloaded" when the
  # registry has as many watchers as it may.

  jobStatus @3 (jobId :Text) -> (status :JobStatus);

  setJobStatus @4 (status :JobStatus, jobCredential :Data) -> ();
  # Launchers report job states. Ending a job removes its endpoints and refuses their
  # registrations; setting it running again lets replicas register anew. Refused with
  # "troupe.permission_denied" without the job's credential. A reason is kept to its first
  # 1024 bytes; a credential over 256 bytes is refused (everywhere) as an invalid argument. The
  # registry remembers a bounded number of jobs (maxJobs): past it the job that ended first is
  # forgotten, and its name is open again.

  createJob @5 (jobId :Text, launcher :Text, replicas :UInt32) -> (credential :Data);
  # Creates the job `jobId` (running) and returns its credential (64 hexadecimal characters: 32
  # random bytes). Refused with "troupe.job_already_exists" while a job of that name is live: one
  # created and not ended (its owner ends it), or an open one with endpoints. An ended job's name
  # may be created again, with a new credential. `launcher` (its kind: "local", "slurm", at most
  # 64 bytes) and `replicas` describe the job for `listJobs`.

  listJobs @6 () -> (jobs :List(JobInfo));
  # Every job the registry knows, sorted by id: those created, claimed or ended (up to maxJobs)
  # and the open ones with endpoints.

  serveJobControl @7 (jobId :Text, control :JobControl, logLocation :Text, jobCredential :Data)
      -> ();
  # The launcher that created the job hands over what stops it and reads its logs; the registry
  # holds it until the job is forgotten, the launcher offers another, or its connection is
  # lost. `logLocation` ("host:/path", at most 1024 bytes) says where the logs lie, for when the
  # launcher is gone. Refused with "troupe.permission_denied" without the job's credential (and
  # for a job nobody created).

  stopJob @8 (jobId :Text, graceMillis :UInt32, credential :Data) -> ();
  # Asks the job's launcher to stop it (JobControl.stop) and returns once it has ended.
  # A job that has ended is refused with "troupe.job_ended", its reason in the message, whatever
  # the credential. Otherwise `credential` must be the job's or the registry's administrator
  # token ("troupe.permission_denied"), and a job without a launcher to relay to (its replicas
  # were started by hand, or its launcher is gone) is refused with "troupe.unreachable", saying
  # where its logs lie.

  readJobLog @9 (jobId :Text, replica :UInt32, offset :UInt64, maxBytes :UInt32)
      -> (piece :LogPiece);
  # JobControl.readLog of the job's launcher, for any client (as resolve is). Refused with
  # "troupe.invalid_argument" for a job the registry does not know or a replica it does not have,
  # and "troupe.unreachable" when no launcher serves it (the message says where the logs lie).
}
