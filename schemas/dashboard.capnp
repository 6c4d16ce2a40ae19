@0xb5365cef18a2381e;
# What the registry's dashboard API answers (GET /api/history, GET /api/job), as capnp-json
# writes these structs. Only ever JSON over HTTP: fields are only added, at new ordinals, so that
# a page and a registry of different versions still read each other.

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("troupe::schema");

using Registry = import "/troupe/schemas/registry.capnp";

struct ErrorRate {
  code @0 :Text;         # "unavailable", "deadline_exceeded", ...
  perSecond @1 :Float64;
}

struct HistorySample {
  # What one endpoint (or a job's endpoints together) did in one interval.
  atMillis @0 :Int64;         # the end of the interval (wall clock, Unix epoch)
  calls @1 :Float64;          # calls finished per second, errors included
  errors @2 :Float64;         # errors per second, every code
  p50 @3 :Float64;            # seconds; 0 when no call finished
  p99 @4 :Float64;
  byCode @5 :List(ErrorRate); # the codes with the most errors
}

struct HistorySeries {
  name @0 :Text;              # the endpoint's name, or the job's id for a job's totals
  samples @1 :List(HistorySample);  # oldest first
}

struct History {
  intervalMillis @0 :UInt32;  # between samples; 0 when the registry keeps no history
  lengthMillis @1 :UInt32;    # how far back it goes
  nowMillis @2 :Int64;        # the registry's wall clock
  jobs @3 :List(HistorySeries);       # each job's totals
  endpoints @4 :List(HistorySeries);  # with ?job=: that job's endpoints
  refused @5 :UInt32;         # endpoints with no history: the registry keeps as many as it may
}

struct JobEvent {
  atMillis @0 :Int64;
  text @1 :Text;
}

struct ReplicaLog {
  replica @0 :UInt32;
  text @1 :Text;              # its last lines
  size @2 :UInt64;            # its log's size in bytes
}

struct JobPage {
  job @0 :Registry.JobInfo;
  events @1 :List(JobEvent);  # oldest first
  detail @2 :Registry.JobDetail;   # from its launcher; absent when none answers
  detailError @3 :Text;       # why there is no detail
  logs @4 :List(ReplicaLog);
  logLocation @5 :Text;       # "host:/path" where its logs lie
}
