#pragma once
// ActorServer: hosts named actors (Cap'n Proto interface implementations) in this process and
// serves them over Cap'n Proto RPC on TCP or unix sockets.

#include <initializer_list>
#include <memory>
#include <string>
#include <type_traits>

#include <capnp/capability.h>
#include <capnp/schema.h>
#include <kj/async.h>
#include <kj/time.h>

#include "troupe/actor/blob.h"
#include "troupe/actor/endpoint.h"
#include "troupe/actor/job_context.h"
#include "troupe/base/event_loop.h"
#include "troupe/net/limits.h"
#include "troupe/observe/http_endpoint.h"

namespace troupe {

// Bounds on what an ActorServer keeps so that a call retried after its connection broke gets
// its reply rather than running again (README, "Errors and retries"). A caller is one client
// handle (an ActorRef, or one pool member's); a reply stays until its caller acknowledges it
// (with its next call) or `retention` passes. Past a bound, the oldest replies are dropped
// first; a retry of a call whose reply was dropped fails with MAY_HAVE_RUN, never runs twice.
// bench/README.md measures the memory per kept reply.
struct ReplyCacheOptions {
  // Whether replies are kept at all. Default true. When false, calls still run once per
  // attempt, and every retry fails with MAY_HAVE_RUN.
  bool enabled = true;

  // How long a reply is kept after its call finished when its caller does not acknowledge it,
  // and how long a caller without calls is remembered. Default 5 minutes.
  kj::Duration retention = 5 * 60 * kj::SECONDS;

  // How long a call still running waits for its caller to come back after every connection it
  // came on broke (a retry attaches to it). With none by then, it is cancelled, when the actor
  // allows cancellation, as a plain call is at once when its caller goes away; a retry that
  // comes later gets MAY_HAVE_RUN. Default 10 s.
  kj::Duration reconnectWindow = 10 * kj::SECONDS;

  // The largest reply kept, in bytes. A call with a larger reply runs once all the same, and its
  // reply reaches the caller as any other, but it is not kept: a retry after the connection
  // broke fails with MAY_HAVE_RUN, saying that the call ran. Keeping a copy of a reply costs its
  // copy and, for one this large, fresh memory each time. Default 4 MiB.
  uint64_t maxReplyBytes = uint64_t(4) << 20;

  // Replies kept per caller. Default 10,000.
  uint32_t maxRepliesPerCaller = 10000;

  // Bytes of replies kept per caller. Default 64 MiB.
  uint64_t maxBytesPerCaller = uint64_t(64) << 20;

  // Replies kept in all. Default 1,000,000.
  uint64_t maxReplies = 1000000;

  // Bytes kept in all, callers' bookkeeping included. Default 512 MiB.
  uint64_t maxBytes = uint64_t(512) << 20;
};

struct ActorServerOptions {
  // How long drain() lets in-flight calls finish before closing their connections (those calls
  // then fail with DISCONNECTED on the caller's side). Default 30 s.
  kj::Duration drainGracePeriod = 30 * kj::SECONDS;

  // Largest message accepted or sent, in bytes; see limits.h. Clients must use the same limit.
  // Default DEFAULT_MAX_MESSAGE_BYTES (512 MiB).
  uint64_t maxMessageBytes = DEFAULT_MAX_MESSAGE_BYTES;

  // This process start's incarnation; 0 (the default) derives a fresh one from the wall clock,
  // larger than that of any earlier start on a machine whose clock does not go backwards.
  uint64_t incarnation = 0;

  // Address published in endpoints; "" (the default) uses the first listener's address, with a
  // wildcard host (0.0.0.0, ::) replaced by JobContext::advertiseHost or this machine's name.
  std::string advertiseAddress;

  // Whether the server, once listening on tcp://, also listens on a unix socket of its own in
  // this user's directory of them (net/same_host.h: a directory only that user can enter) and
  // publishes its path in every endpoint's metadata, so that an ActorGroup on the same host and
  // network namespace, run by the same user, calls through it rather than loopback TCP (a small
  // call is about 15 % faster, bench/README.md). A tls:// server does not: a socket only its user
  // reaches needs no encryption, but the server asked for TLS. When the socket cannot be made the
  // server logs why and serves TCP alone. Default true.
  bool sameHost = true;

  // Where the server logs (listening, draining, failed connections). Default: the loop's logger.
  std::shared_ptr<spdlog::logger> logger;

  // What tls:// listeners present and check clients with, and the cluster token clients must
  // present. Default: null, meaning the loop's (loopCredentials(), net/credentials.h).
  std::shared_ptr<Credentials> credentials;

  // Bounds on what peers can make the server hold: open connections, bytes of messages still
  // arriving, and how long a connection may take to send its first message or finish one
  // (limits.h; defaults 4096, 1 GiB, 10 s and 60 s).
  ConnectionLimits connections;

  // Where the server serves HTTP (http_endpoint.h) once it listens: "HOST:PORT" (port 0 for any
  // free port). /metrics has the metrics of every component on the server's loop, /healthz
  // answers 200 while the server serves and 503 while it drains (for load balancers and
  // Kubernetes probes), /actors lists the hosted actors as JSON (schemas/actor.capnp
  // ServerInfo). Its URL is published in every endpoint's metadata under "metrics". With a
  // cluster token, every path but /healthz needs it as a Bearer token; with TLS it is HTTPS.
  // Default "": JobContext::metricsAddress (TROUPE_METRICS), and no HTTP when that is empty too.
  std::string httpAddress;

  // Options of that endpoint (the credentials default to the server's).
  HttpEndpointOptions http;

  // Whether calls are counted and timed (metrics()). Default true; false saves the two clock
  // reads and the few increments per call (bench/README.md measures them), and leaves the
  // call series at zero.
  bool metrics = true;

  // What the server keeps for calls retried after a broken connection.
  ReplyCacheOptions replies;
};

struct ActorOptions {
  // How many calls to this actor may be in progress at once; a call is in progress until the
  // promise its method returned completes. Further calls wait, in arrival order. 1 (the
  // default) runs calls one at a time; 0 lets calls interleave whenever a method waits on a
  // promise (Cap'n Proto's own behaviour).
  uint32_t maxConcurrency = 1;

  // How many calls may wait for a place once maxConcurrency calls are in progress. A call past
  // it is refused before it runs with QUEUE_FULL (an OVERLOADED error that guarantees the call
  // did not run), so a pool sends it to another member, idempotent or not: the queue, and the
  // memory its calls' parameters hold, stays bounded whatever callers send. 0: no call waits.
  // Default 1024.
  uint32_t maxQueued = 1024;

  // Whether a call is cancelled on the server when its caller cancels it (drops the promise or
  // its deadline passes): the promise the method returned is dropped. Default true. Set false
  // for an actor whose methods must not stop half-way.
  bool allowCancellation = true;
};

// Receives the server's endpoint changes; a publisher in resolver/ turns them into
// registrations. Called on the loop thread.
class EndpointListener {
public:
  virtual ~EndpointListener() noexcept(false) = default;
  // An endpoint appeared (an actor was hosted while listening, or the server started
  // listening) or its state changed.
  virtual void endpointChanged(const Endpoint& endpoint) = 0;
  // The endpoint is gone (the server stopped).
  virtual void endpointRemoved(const Endpoint& endpoint) = 0;
};

enum class ServerState : uint8_t {
  STARTING,  // not listening yet
  SERVING,   // listening; endpoints READY
  DRAINING,  // refusing new calls, letting in-flight ones finish
  STOPPED,   // listeners and connections closed
};

// Belongs to the loop it was made with; destroy it before that loop. Destroying it closes every
// listener and connection at once (calls in flight fail with DISCONNECTED on their callers'
// side); drain() first for a graceful stop.
class ActorServer {
public:
  ActorServer(EventLoop& loop, JobContext job, ActorServerOptions options = {});
  ~ActorServer() noexcept(false);
  KJ_DISALLOW_COPY(ActorServer);

  // Hosts `impl` under `name` as an actor of interface T. The actor is reachable at once on
  // every listener and published as "<job_id>/<name>-<task_index>". Throws INVALID_ARGUMENT for a
  // bad name or one already hosted, and FAILED once drain() started.
  template <typename T, typename Impl>
  void host(kj::StringPtr name, kj::Own<Impl> impl, ActorOptions options = {}) {
    static_assert(std::is_base_of_v<typename T::Server, Impl>,
                  "host<T>(name, impl): impl must implement T::Server");
    hostCapability(name, capnp::Schema::from<T>(), capnp::Capability::Client(kj::mv(impl)),
                   options);
  }

  // The untyped form of host(): `actor` is any capability implementing `schema`.
  void hostCapability(kj::StringPtr name, capnp::InterfaceSchema schema,
                      capnp::Capability::Client actor, ActorOptions options = {});

  // Receives blobs named `name` (blob.h) sent to this server: `allocate` gives the memory for
  // each (or throws to refuse it before any byte moves), `handle` takes it once it is whole and
  // checked. Senders' broadcasts may also have this server forward what it receives to other
  // members. Throws INVALID_ARGUMENT for a bad name (the rules of actor names) or one accepted
  // already. The callbacks run on the loop and are kept until the server is destroyed.
  void acceptBlobs(kj::StringPtr name, BlobAllocator allocate, BlobHandler handle,
                   BlobAcceptOptions options = BlobAcceptOptions());

  // Blob transfers in progress, or finished and still remembered (for a sender that resumes
  // them), across every acceptBlobs() name.
  size_t blobTransferCount() const;

  // Starts listening on `address` ("tcp://host:port" with port 0 for any free port, or
  // "unix:/path") and returns the address bound, with the port filled in. May be called more
  // than once. The first call moves the server to SERVING and its endpoints to READY. Throws
  // INVALID_ARGUMENT for a malformed address, ADDRESS_IN_USE when it is taken, and FAILED once
  // drain() started. A stale unix socket file (nothing listening behind it) is replaced; it is
  // removed again on stop.
  std::string listen(kj::StringPtr address);

  // Serves until SIGTERM or SIGINT arrives, or a drain is requested (drain() or a peer's
  // ActorHost.drain), then drains and resolves once stopped. The signals are caught until the
  // server stops, so one arriving during a drain joins it; after the server stopped (or after a
  // second signal) they have their default effect again. Listens on defaultListenAddress()
  // first if listen() was never called. The server must outlive the returned promise, and that
  // of drain().
  kj::Promise<void> serve();
  // serve() catching `signals` instead of SIGTERM and SIGINT (none: only a drain request ends
  // it), for a server that shares its process with a program handling the others (Ctrl-C)
  // itself.
  kj::Promise<void> serve(std::initializer_list<int> signals);

  // Where serve() listens when listen() was never called: tls:// when the server's credentials
  // can serve TLS, tcp:// otherwise; on 127.0.0.1, or on 0.0.0.0 when JobContext::advertiseHost
  // is set; port 0.
  std::string defaultListenAddress() const;

  // serve().wait(loop.waitScope()): the last line of a replica's main().
  void serveUntilSignal();

  // Graceful stop: endpoints go DRAINING, new calls are refused with DRAINING (they never ran,
  // so callers may send them elsewhere), calls in flight finish within `grace` (default:
  // options.drainGracePeriod), their replies are flushed, then listeners and connections close
  // and endpoints are removed. Resolves when stopped; calling it again joins the same drain.
  kj::Promise<void> drain(kj::Maybe<kj::Duration> grace = nullptr);

  // What the server's listeners present and require (ActorServerOptions::credentials, or the
  // loop's).
  const Credentials& credentials() const;

  // Where the server is in its life; this process start's incarnation; the job it serves.
  ServerState state() const;
  uint64_t incarnation() const;
  const JobContext& job() const;

  // One endpoint per hosted actor, in hosting order; empty until the server listens.
  kj::Array<Endpoint> endpoints() const;

  // Addresses bound by listen(), in order.
  kj::Array<std::string> listenAddresses() const;

  // Calls accepted and not yet finished, across all actors (queued ones included).
  uint64_t callsInFlight() const;

  // This server's metrics now (metrics.h): per actor and method, calls started, finished by
  // outcome (troupe_calls_total{code}), in flight and their latency; per actor the queue at its
  // gate; its connections, messages and bytes. A value, for a program to log or assert on.
  MetricsSnapshot metrics() const;

  // The HTTP endpoint's URL as published ("http://host:port"), or "" when it serves none.
  std::string httpUrl() const;

  // Connections open now (past their TLS handshake), and the bytes the messages still arriving
  // on them hold (see ActorServerOptions::connections).
  size_t connectionCount() const;
  uint64_t incompleteMessageBytes() const;

  struct Impl;

  // Keeps a listener told of the server's endpoint changes until dropped (see
  // addEndpointListener). The server must outlive it.
  class ListenerRegistration {
  public:
    ListenerRegistration() = default;
    ListenerRegistration(ListenerRegistration&& other) noexcept;
    ListenerRegistration& operator=(ListenerRegistration&& other) noexcept;
    ~ListenerRegistration() noexcept(false);

  private:
    friend class ActorServer;
    ListenerRegistration(Impl& server, EndpointListener& listener)
        : server(&server), listener(&listener) {}
    void release();
    Impl* server = nullptr;  // null once moved from
    EndpointListener* listener = nullptr;
  };

  // Tells `listener` about endpoint changes, starting with the current endpoints, until the
  // registration returned is dropped; `listener` must outlive that. Listeners are told in the
  // order added.
  [[nodiscard]] ListenerRegistration addEndpointListener(EndpointListener& listener);

private:
  kj::Own<Impl> impl;
};

}  // namespace troupe
