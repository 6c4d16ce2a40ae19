#pragma once
// RegistryServer: troupe's embedded default registry. A small Cap'n Proto service implementing
// schema::Registry (schemas/registry.capnp), run inside any process (a test, a launcher, a
// coordinator) or on its own as the `troupe-registry` daemon. Clients reach it through
// RegistryResolver.

#include <memory>
#include <string>

#include <kj/async.h>
#include <kj/time.h>

#include "troupe/base/event_loop.h"
#include "troupe/net/limits.h"
#include "troupe/observe/http_endpoint.h"
#include "troupe/schemas/registry.capnp.h"

namespace troupe {

namespace resolver_detail {
class RegistryTable;
}

struct RegistryServerOptions {
  // Lease TTL granted when a registration asks for 0. Default 10 s.
  kj::Duration defaultTtl = 10 * kj::SECONDS;

  // Requested TTLs are clamped to [minTtl, maxTtl]. Defaults 100 ms and 5 min. A registrant
  // must renew within the granted TTL (Lease.renew returns it).
  kj::Duration minTtl = 100 * kj::MILLISECONDS;
  kj::Duration maxTtl = 5 * kj::MINUTES;

  // Largest endpoint accepted, counting its name, address and metadata keys and values, in
  // bytes; larger registrations are refused with INVALID_ARGUMENT. Default 64 KiB.
  size_t maxEndpointBytes = 64 * 1024;

  // Endpoints registered, in all. Past it a registration of a new name is refused with
  // OVERLOADED (its client retries with backoff); a newer incarnation still replaces an entry.
  // Default 100,000.
  size_t maxEndpoints = 100000;

  // Watchers, in all. Past it watch() is refused with OVERLOADED. Default 10,000.
  size_t maxWatchers = 10000;

  // Jobs remembered: created or claimed (with their credential) and ended (with their state and
  // reason, so late registrations are refused with JOB_ENDED). Past it the job that ended first
  // is forgotten, and its name is open again; when none has ended, creating or claiming another
  // is refused with OVERLOADED. Default 100,000 (a job costs about 200 bytes and its reason).
  size_t maxJobs = 100000;

  // Events queued for one watcher whose events() call has not returned; a watcher that falls
  // further behind is cut off as overloaded: dropped, with a warning naming it and the bound
  // (its client sees the Watcher capability released, subscribes again and reconciles what it
  // missed). Default 100,000.
  size_t maxQueuedEvents = 100000;

  // Bytes of events queued for all watchers together, counting those in events() calls not yet
  // answered. Past it, the watcher furthest behind (most bytes) is cut off as above, until the
  // total fits: however many watchers stop reading, they hold at most this. It must exceed the
  // snapshot of the largest prefix watched, which a new watcher is sent first. Default 64 MiB
  // (`troupe registry --max-queued-event-bytes`).
  size_t maxQueuedEventBytes = size_t{64} << 20;

  // Largest message accepted or sent on a connection, in bytes. A registry's messages are
  // small; the limit bounds what one client can make it allocate. Clients may use a larger
  // limit. Default 64 MiB.
  uint64_t maxMessageBytes = uint64_t{64} << 20;

  // How long drain() lets the answers already given reach their callers before it closes the
  // connections. Default 1 s.
  kj::Duration drainGracePeriod = 1 * kj::SECONDS;

  // Where the registry logs: info for registrations, removals and expiries, warn for refusals.
  // Default: the loop's logger.
  std::shared_ptr<spdlog::logger> logger;

  // What tls:// listeners present and check clients with, and the cluster token clients must
  // present. Default: null, meaning the loop's (loopCredentials(), net/credentials.h).
  std::shared_ptr<Credentials> credentials;

  // The administrator token: who presents it may stop any job (stopJob), as the job's own
  // credential does. Empty (the default): only jobs' owners may. Keep it in a file of its
  // owner's alone (troupe registry --admin-token-file); it is never logged.
  std::string adminToken;

  // Bounds on what clients can make the registry hold: open connections, bytes of messages
  // still arriving, and how long a connection may take to send its first message or finish one
  // (limits.h; defaults 4096, 256 MiB, 10 s and 60 s; `troupe registry --max-connections`,
  // `--max-incomplete-bytes`). A registry's messages are small, hence the smaller budget.
  ConnectionLimits connections{.maxIncompleteMessageBytes = uint64_t{256} << 20};

  // Options of the HTTP endpoint listenHttp() opens (credentials default to the registry's).
  HttpEndpointOptions http;

  // The dashboard's history (while the registry serves HTTP): every `historyInterval` the
  // registry reads each endpoint's /metrics and keeps, per endpoint and per job, `historyLength`
  // of calls/s, errors/s by code, p50 and p99, for at most `maxHistorySeries` endpoints and jobs
  // together, about 9 KiB each at the defaults (18 MiB at most). An interval of 0 keeps none.
  // `troupe registry --history-interval`, `--history-length`.
  kj::Duration historyInterval = 5 * kj::SECONDS;
  kj::Duration historyLength = 15 * kj::MINUTES;
  size_t maxHistorySeries = 2000;
};

// An in-memory registry of endpoints, leases, watchers and job states. Belongs to the loop it
// was made with (single-threaded: every call and every capability it hands out is served on that
// loop's thread); destroy it before that loop.
//
// Registrations are Lease capabilities. An entry lives while its lease is held and renewed: the
// entry is removed at once when the Lease capability is released (dropped by its holder, or
// released by Cap'n Proto when the holder's connection goes), and removed when no renew()
// arrived within the TTL. A newer incarnation of the same name replaces the entry and revokes
// the old lease (its renew() and setState() fail with LEASE_LOST; releasing it later leaves the
// new entry alone). Everything is lost when the registry stops: registrants re-register (as
// RegistryResolver does by itself).
//
// Destroying it closes every listener and connection at once; capabilities still held
// in-process then fail with DISCONNECTED.
class RegistryServer final {
public:
  RegistryServer(EventLoop& loop, RegistryServerOptions options = {});
  ~RegistryServer() noexcept(false);
  KJ_DISALLOW_COPY(RegistryServer);

  // Starts listening on `address` ("tcp://host:port" with port 0 for any free port, or
  // "unix:/path") and returns the address bound, with the port filled in. May be called more
  // than once. Throws INVALID_ARGUMENT for a malformed address, ADDRESS_IN_USE when it is taken,
  // and FAILED once drain() was called. A stale unix socket file (nothing listening behind it) is
  // replaced; the file is removed again on stop.
  std::string listen(kj::StringPtr address);

  // Serves the dashboard and the registry's metrics over HTTP on `address` ("HOST:PORT", port 0
  // for any free one; see http_endpoint.h) and returns its URL ("http://HOST:PORT"):
  //
  //   /                  the dashboard: every job and endpoint, live (resolver/dashboard/)
  //   /metrics           the metrics of every component on the registry's loop (Prometheus)
  //   /healthz           200 while the registry serves
  //   /api/state, /api/events, /api/metrics?endpoint=NAME   what the dashboard reads
  //                      (resolver/detail/registry_http.h)
  //
  // With a cluster token every path but the page, its assets and /healthz needs it as a Bearer
  // token. At most one HTTP address; throws FAILED for a second, and as HttpEndpoint does.
  std::string listenHttp(kj::StringPtr address);

  // The Registry capability served to every connection, for use in this process (tests, a
  // launcher beside the registry). Valid until drain(); its calls fail with DISCONNECTED after.
  schema::Registry::Client capability();

  // Stops: closes the listeners, forgets every entry and job state (later calls, on connections
  // or capabilities still held, fail with DISCONNECTED), lets the answers already given reach
  // their callers (for up to options.drainGracePeriod), then closes every connection; leases and
  // watchers go with them, and watchers are not told. Resolves once done; calling it again joins
  // the same drain. Destroying the server first rejects the promise.
  kj::Promise<void> drain();

  // Addresses bound by listen(), in order; empty once drain() was called.
  kj::Array<std::string> listenAddresses() const;

  // Live entries.
  size_t endpointCount() const;

  // Live watchers.
  size_t watcherCount() const;

  // Bytes of events queued for watchers now (see maxQueuedEventBytes).
  size_t queuedEventBytes() const;

  // Open client connections.
  size_t connectionCount() const;

  struct Impl;

private:
  kj::Own<Impl> impl;
};

}  // namespace troupe
