@0xd3c1b4a7e95f2c60;
# The parts of etcd's v3 JSON gateway (etcd 3.4, /v3/...) that EtcdResolver speaks, as Cap'n
# Proto structs for capnp-json: field names are etcd's (protobuf's JSON names), 64-bit numbers
# travel as strings, keys and values as base64. Not troupe's wire contract: etcd's, written down.
# Fields etcd leaves at their defaults are absent from its JSON and read as the defaults here.

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("troupe::schema::etcd");

using Json = import "/capnp/compat/json.capnp";

struct ResponseHeader {
  clusterId @0 :UInt64 $Json.name("cluster_id");
  memberId @1 :UInt64 $Json.name("member_id");
  revision @2 :Int64;
  raftTerm @3 :UInt64 $Json.name("raft_term");
}

struct KeyValue {
  key @0 :Data $Json.base64;
  createRevision @1 :Int64 $Json.name("create_revision");
  modRevision @2 :Int64 $Json.name("mod_revision");
  version @3 :Int64;
  value @4 :Data $Json.base64;
  lease @5 :Int64;
}

struct RangeRequest {
  key @0 :Data $Json.base64;
  rangeEnd @1 :Data $Json.base64 $Json.name("range_end");
  limit @2 :Int64;
  revision @3 :Int64;
  keysOnly @4 :Bool $Json.name("keys_only");
  countOnly @5 :Bool $Json.name("count_only");
}

struct RangeResponse {
  header @0 :ResponseHeader;
  kvs @1 :List(KeyValue);
  more @2 :Bool;
  count @3 :Int64;
}

struct PutRequest {
  key @0 :Data $Json.base64;
  value @1 :Data $Json.base64;
  lease @2 :Int64;
}

struct PutResponse {
  header @0 :ResponseHeader;
}

struct DeleteRangeRequest {
  key @0 :Data $Json.base64;
  rangeEnd @1 :Data $Json.base64 $Json.name("range_end");
}

struct DeleteRangeResponse {
  header @0 :ResponseHeader;
  deleted @1 :Int64;
}

struct Compare {
  enum Result {
    equal @0 $Json.name("EQUAL");
    greater @1 $Json.name("GREATER");
    less @2 $Json.name("LESS");
    notEqual @3 $Json.name("NOT_EQUAL");
  }
  enum Target {
    version @0 $Json.name("VERSION");
    create @1 $Json.name("CREATE");
    mod @2 $Json.name("MOD");
    value @3 $Json.name("VALUE");
    lease @4 $Json.name("LEASE");
  }
  result @0 :Result;
  target @1 :Target;
  key @2 :Data $Json.base64;
  union {
    version @3 :Int64;
    createRevision @4 :Int64 $Json.name("create_revision");
    modRevision @5 :Int64 $Json.name("mod_revision");
    value @6 :Data $Json.base64;
    lease @7 :Int64;
  }
}

struct RequestOp {
  union {
    requestRange @0 :RangeRequest $Json.name("request_range");
    requestPut @1 :PutRequest $Json.name("request_put");
    requestDeleteRange @2 :DeleteRangeRequest $Json.name("request_delete_range");
  }
}

struct ResponseOp {
  union {
    none @0 :Void;
    responseRange @1 :RangeResponse $Json.name("response_range");
    responsePut @2 :PutResponse $Json.name("response_put");
    responseDeleteRange @3 :DeleteRangeResponse $Json.name("response_delete_range");
  }
}

struct TxnRequest {
  compare @0 :List(Compare);
  success @1 :List(RequestOp);
  failure @2 :List(RequestOp);
}

struct TxnResponse {
  header @0 :ResponseHeader;
  succeeded @1 :Bool;
  responses @2 :List(ResponseOp);
}

struct LeaseGrantRequest {
  ttl @0 :Int64 $Json.name("TTL");
  id @1 :Int64 $Json.name("ID");
}

struct LeaseGrantResponse {
  header @0 :ResponseHeader;
  id @1 :Int64 $Json.name("ID");
  ttl @2 :Int64 $Json.name("TTL");
  error @3 :Text;
}

struct LeaseKeepAliveRequest {
  id @0 :Int64 $Json.name("ID");
}

struct LeaseKeepAliveResponse {
  header @0 :ResponseHeader;
  id @1 :Int64 $Json.name("ID");
  ttl @2 :Int64 $Json.name("TTL");
}

struct LeaseKeepAliveResult {
  # The gateway streams keepalive answers: one object holding the response.
  result @0 :LeaseKeepAliveResponse;
}

struct LeaseRevokeRequest {
  id @0 :Int64 $Json.name("ID");
}

struct WatchCreateRequest {
  key @0 :Data $Json.base64;
  rangeEnd @1 :Data $Json.base64 $Json.name("range_end");
  startRevision @2 :Int64 $Json.name("start_revision");
  progressNotify @3 :Bool $Json.name("progress_notify");
  prevKv @4 :Bool $Json.name("prev_kv");
}

struct WatchRequest {
  createRequest @0 :WatchCreateRequest $Json.name("create_request");
}

struct Event {
  enum Type {
    put @0 $Json.name("PUT");
    delete @1 $Json.name("DELETE");
  }
  type @0 :Type;
  kv @1 :KeyValue;
  prevKv @2 :KeyValue $Json.name("prev_kv");
}

struct WatchResponse {
  header @0 :ResponseHeader;
  watchId @1 :Int64 $Json.name("watch_id");
  created @2 :Bool;
  canceled @3 :Bool;
  compactRevision @4 :Int64 $Json.name("compact_revision");
  cancelReason @5 :Text $Json.name("cancel_reason");
  events @6 :List(Event);
}

struct Status {
  # What the gateway answers instead when a request fails (a gRPC status).
  error @0 :Text;
  message @1 :Text;
  code @2 :Int32;
}

struct WatchResult {
  # One object of the watch stream: a response, or the error that ended the stream.
  result @0 :WatchResponse;
  error @1 :Status;
}

struct Job {
  # The value troupe keeps under <root>/jobs/<job id>. (Under <root>/endpoints/<name> it keeps
  # an Actor.Endpoint, as capnp-json writes it.)
  state @0 :Text;       # "running" or "ended"
  reason @1 :Text;
  owner @2 :Text;       # SHA-256 of the job's credential, in hex; empty while the job is open
  launcher @3 :Text;    # what its launcher said of it (JobDescription)
  replicas @4 :UInt32;
  createdAtMillis @5 :Int64;  # wall clock (Unix epoch, ms)
  endedAtMillis @6 :Int64;
}
