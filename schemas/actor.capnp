@0xe0371aae79f83315;
# The wire contract between a troupe client and an ActorServer. Stable: fields are only ever
# added, at new ordinals.

using Cxx = import "/capnp/c++.capnp";
using Schema = import "/capnp/schema.capnp";
using Blob = import "/troupe/schemas/blob.capnp";
$Cxx.namespace("troupe::schema");

enum EndpointState {
  # Lifecycle of a published endpoint. An endpoint that is gone is absent, not a state.
  starting @0;   # registered, not yet serving
  ready @1;      # serving calls
  draining @2;   # refusing new calls while in-flight calls finish
}

struct MetadataEntry {
  key @0 :Text;
  value @1 :Text;
}

struct Endpoint {
  # One hosted actor as a resolver publishes it.
  name @0 :Text;           # "<job_id>/<actor>-<task_index>"
  address @1 :Text;        # "tcp://host:port" or "unix:/path"
  jobId @2 :Text;
  actor @3 :Text;
  taskIndex @4 :UInt32;
  incarnation @5 :UInt64;  # differs on every start of the hosting process
  state @6 :EndpointState;
  metadata @7 :List(MetadataEntry);
  registeredAtMillis @8 :UInt64;
  # When the resolver accepted this incarnation's registration (Unix time, milliseconds); 0 when
  # the resolver does not say (a fixed list).
}

struct ActorInfo {
  # What an ActorServer says about one hosted actor, taken from the compiled schema.
  name @0 :Text;            # the name it is hosted under
  interfaceName @1 :Text;   # e.g. "calculator.capnp:Calculator"
  interfaceId @2 :UInt64;
  methods @3 :List(Text);   # method names, superclass methods included
}

# What an ActorServer's HTTP endpoint says at /actors (as JSON).
struct ServerInfo {
  jobId @0 :Text;
  taskIndex @1 :UInt32;
  incarnation @2 :UInt64;
  state @3 :EndpointState;
  address @4 :Text;          # the endpoints' address
  actors @5 :List(ActorInfo);
}

interface Authenticator {
  # The bootstrap capability of every connection to a troupe server (an ActorServer, the
  # registry): before it authenticates, a connection can do nothing else (SECURITY.md).

  authenticate @0 (token :Data) -> (service :Capability);
  # Presents the cluster token (empty for none) and returns the server's own bootstrap
  # capability (ActorHost, Registry). A server with a token requires it, unless the connection
  # came with a client certificate under mutual TLS; one without takes any. Fails with
  # "troupe.unauthenticated" otherwise; after 3 failures the server closes the connection.
}

interface ActorHost {
  # What an ActorServer's Authenticator hands an authenticated connection.

  getActor @0 (name :Text, caller :CallerHello)
      -> (actor :Capability, info :ActorInfo, incarnation :UInt64);
  # The named actor. Fails with "troupe.actor_not_found" when nothing is hosted under that name
  # and with "troupe.draining" once the server drains. `caller`, when set, introduces a client
  # that will send ExactlyOnce calls to it.

  listActors @1 () -> (actors :List(ActorInfo), incarnation :UInt64);

  ping @2 () -> (incarnation :UInt64, state :EndpointState);
  # Cheap liveness check; `incarnation` changes when the hosting process restarts.

  drain @3 (graceMillis :UInt32, jobCredential :Data) -> ();
  # Starts draining the whole server (0 = the server's configured grace period) and returns at
  # once; the connection closes when the drain completes. Needs the credential of the server's
  # job: refused with "troupe.permission_denied" without it, and always by a server that has
  # none (stop such a server with a signal).
  getSchema @4 (name :Text) -> (interfaceId :UInt64, nodes :List(Schema.Node));
  # The compiled schema of the named actor's interface: its node and every node it refers to
  # (superclasses, methods' parameter and result structs, the structs, enums and interfaces
  # their fields use), so that a client without generated code can load them into a
  # capnp::SchemaLoader and call the actor dynamically. Fails like getActor for an unknown name.

  receiveBlob @5 (header :Blob.BlobHeader, hops :List(Blob.BlobHop))
      -> (sink :Blob.BlobSink, resumeAt :UInt64, pulls :Bool);
  # Starts receiving a blob (what ActorServer::acceptBlobs accepts under header.name), or resumes
  # the transfer header.transfer from byte `resumeAt` when this server has part of it already (its
  # sender died and another took over). The receiver forwards what it receives to the
  # `hops` whose parent is -1, and tells each of them whom to forward to in turn. `pulls`: the
  # receiver opened header.deviceMemory, or can read the sender's memory (header.senderMemory),
  # and copies each chunk from there itself; the sender then writes each chunk as `pulled` once
  # it is in place in that memory, rather than sending it.
  # Refused before any byte moves with "troupe.blob_refused" (no receiver of that name, too big,
  # a version it has or is receiving a newer one of), "troupe.invalid_argument" for a malformed
  # header or hop list, and like getActor while draining.
}

struct CallerHello {
  # A client that sends ExactlyOnce calls introduces itself in every ActorHost.getActor.
  callerId @0 :UInt64;
  # Random, chosen once per client handle (ActorRef); never 0.
  floor @1 :UInt64;
  # Used only by a server that does not know the caller: it takes every retried call below
  # `floor` as possibly run and forgotten. A client that has sent calls to this server before
  # says the next sequence number it would give; one that has not says the lowest it may retry.
}

interface ExactlyOnce {
  # How a troupe client sends a call that must not run twice. The gate in front of every hosted
  # actor takes it on the actor's own capability: it runs the call inside (`interfaceId`,
  # `methodId`, `params`) once per (callerId, seq), keeps its reply until the caller
  # acknowledges it, and answers a retry with the same id from what it kept. Plain Cap'n Proto
  # calls to the actor keep working as before.

  call @0 (callerId :UInt64, seq :UInt64, incarnation :UInt64, retry :Bool,
           ackBelow :UInt64, acks :List(UInt64),
           interfaceId :UInt64, methodId :UInt16, params :AnyPointer)
      -> (results :AnyPointer, error :OnceError);
  # `seq` counts the caller's calls from 1. `retry`: an earlier attempt with this id may have
  # reached the server whose incarnation is `incarnation`; a retry the server cannot answer
  # (another incarnation, or its reply no longer kept) fails with "troupe.may_have_run" rather
  # than run again. `ackBelow` and `acks`: the caller has every reply below `ackBelow` and those
  # listed, and will not ask for them again. An error the call inside ended with (the actor's,
  # or troupe's on the server) comes back in `error`, `results` then unset, so that the caller
  # can tell it from the connection breaking: the call itself fails only when the server cannot
  # answer it (a retry it can no longer tell, a refusal while draining or full).

  cancel @1 (callerId :UInt64, seq :UInt64) -> ();
  # The caller gave up on the call (it cancelled, or its deadline passed): the server cancels it
  # if the actor allows cancellation (ActorOptions::allowCancellation), as Cap'n Proto does when
  # a caller drops a plain call.
}

struct OnceError {
  # How an ExactlyOnce call's inner call failed, as Cap'n Proto's own Exception carries it.
  type @0 :UInt8;
  # kj::Exception::Type: 0 failed, 1 overloaded, 2 disconnected, 3 unimplemented.
  description @1 :Text;
}
