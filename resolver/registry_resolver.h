#pragma once
// RegistryResolver: the Resolver of a RegistryServer (the `troupe-registry` daemon or one
// embedded in another process), reached over one Cap'n Proto connection.

#include <memory>

#include <kj/time.h>

#include "troupe/base/event_loop.h"
#include "troupe/net/credentials.h"
#include "troupe/net/limits.h"
#include "troupe/resolver/resolver.h"

namespace troupe {

namespace resolver_detail {
class RegistryLink;
}

struct RegistryResolverOptions {
  // Lease TTL asked of the registry for each registration: the registry removes an endpoint
  // whose process stopped renewing (frozen, partitioned) this long after the last renewal. The
  // registry clamps it to its own bounds. Default 0: the registry's default (10 s unless
  // `troupe registry --default-ttl` says otherwise).
  kj::Duration ttl = 0 * kj::SECONDS;

  // How often registrations renew their lease; 0 (the default) means a third of the TTL the
  // registry granted. Renewals never come less often than that.
  kj::Duration renewInterval = 0 * kj::SECONDS;

  // Waits between attempts to reach the registry again (re-registering, re-subscribing a watch):
  // the first retry after `reconnectBackoffInitial`, each next one twice as long up to
  // `reconnectBackoffMax`, each with random jitter (between half and all of it). Defaults
  // 100 ms and 1 s, so that a registry back after a restart has every registration again
  // within about a second.
  kj::Duration reconnectBackoffInitial = 100 * kj::MILLISECONDS;
  kj::Duration reconnectBackoffMax = 1 * kj::SECONDS;

  // How long a watch that subscribed again (after a broken connection or a registry restart)
  // keeps an endpoint the registry's new snapshot lacks before reporting it REMOVED: endpoints
  // whose registrations are on their way back (within reconnectBackoffMax) then cause no event
  // at all, or CHANGED if something about them changed. One whose job ended is REMOVED at
  // once. Default 3 s.
  kj::Duration reconcileGrace = 3 * kj::SECONDS;

  // Deadline of each call to the registry (register, renew, watch, resolve, jobStatus,
  // setJobStatus), connecting included. Default 10 s.
  kj::Duration callTimeout = 10 * kj::SECONDS;

  // Largest message sent or accepted on the connection, in bytes. Default
  // DEFAULT_MAX_MESSAGE_BYTES.
  uint64_t maxMessageBytes = DEFAULT_MAX_MESSAGE_BYTES;

  // Where the resolver logs (registrations, retries, lost leases). Default: the loop's logger.
  std::shared_ptr<spdlog::logger> logger;

  // What the connection to the registry verifies it with (TLS) and presents: the cluster token,
  // and the job credential that registrations carry. Default: null, meaning the loop's.
  std::shared_ptr<Credentials> credentials;
};

// Belongs to the loop it was made on; everything it hands out (watches, registrations, promises)
// is used on that loop's thread. One connection to the registry, made when first needed and
// made again after it breaks, carries every call, registration and watch.
//
// Registrations and watches keep the connection (not the resolver) alive: they go on working
// after the resolver is dropped, and each ends when dropped itself.
//
// While it holds registrations, the resolver also keeps a watch on the prefix "~troupe.liveness"
// (which matches no endpoint name), so that it learns at once when the connection breaks: the
// registry's restart then brings registrations back within the reconnect backoff, not at the
// next renewal.
class RegistryResolver final : public Resolver {
public:
  // `address` is "registry://HOST:PORT" (TCP), "registry+tls://HOST:PORT" (TLS, verified with
  // the credentials of options.channel or the loop) or "registry+unix:PATH" (a unix socket), or
  // a plain troupe address ("tcp://HOST:PORT", "tls://HOST:PORT", "unix:PATH"); the port
  // defaults to 7700. Throws INVALID_ARGUMENT for anything else. Does not connect yet.
  RegistryResolver(EventLoop& loop, kj::StringPtr address, RegistryResolverOptions options = {});
  ~RegistryResolver() noexcept(false);
  KJ_DISALLOW_COPY(RegistryResolver);

  // The registry's endpoints under `prefix`, sorted by name. Throws INVALID_ARGUMENT for a
  // malformed prefix (validatePrefix). Rejects with UNREACHABLE when no connection to the
  // registry can be made, DEADLINE_EXCEEDED when it does not answer within callTimeout, and
  // DISCONNECTED when the connection broke twice during the call (it is retried once).
  kj::Promise<kj::Array<Endpoint>> resolve(kj::StringPtr prefix) override;

  // A watch fed by the registry (see Watch). Throws INVALID_ARGUMENT for a malformed prefix.
  // When the connection breaks, or the registry drops the watch, it subscribes again (with the
  // reconnect backoff, for as long as it takes) and reconciles: once the new snapshot is
  // complete it reports REMOVED for endpoints it had reported whose job the registry says has
  // ended (followed by JOB_ENDED), ADDED for new ones, CHANGED for those that differ (in more
  // than their registration time, which a restarted registry gives anew: the first one reported
  // stays), then SYNCED; an endpoint it had reported that is missing otherwise is REMOVED only if
  // it has not come back within options.reconcileGrace. Nothing is reported twice and no event
  // is lost: events queue until next() takes them. next() rejects (once the queue is drained) only
  // when the registry refuses the watch itself, with the registry's error. Dropping the watch ends
  // it.
  kj::Own<Watch> watch(kj::StringPtr prefix) override;

  // Registers `endpoint` in the background and keeps it registered until the returned object is
  // dropped: renews the lease every renewInterval, forwards setState(), and registers again
  // (with the current state) when the lease is lost or the connection breaks, retrying with the
  // reconnect backoff while the registry is unreachable (a registry that is down at start is
  // waited for; the first failure is logged at warn). jobId, actor and taskIndex are taken from
  // the name.
  //
  // whenRegistered() resolves at the first success and rejects with the refusal when the first
  // attempt is refused for good: INVALID_ARGUMENT (also for a bad name, without contacting the
  // registry), JOB_ENDED or NAME_TAKEN. After a success, a re-registration refused with
  // JOB_ENDED or INVALID_ARGUMENT stops the registration (logged); one refused with NAME_TAKEN
  // is retried with backoff (the holder may be this registration's own lease on a connection
  // the registry has not yet seen close; it expires within its TTL).
  //
  // Dropping the registration releases the lease, which removes the endpoint at once; a pending
  // whenRegistered() then rejects with DISCONNECTED.
  kj::Own<Registration> registerEndpoint(Endpoint endpoint) override;

  // The registry's record of the job (RUNNING for a job it has not heard of). Throws
  // INVALID_ARGUMENT for a bad job id; rejects like resolve().
  kj::Promise<JobStatus> jobStatus(kj::StringPtr jobId) override;

  // Records a job's state in the registry (see Resolver::setJobStatus). Throws INVALID_ARGUMENT
  // for a bad job id; rejects like resolve(), or with PERMISSION_DENIED.
  kj::Promise<void> setJobStatus(JobStatus status, std::string jobCredential = {}) override;

  // Creates the job in the registry (Resolver::createJob); it stays live until it is set ended
  // with its credential. Rejects like resolve(), or with JOB_ALREADY_EXISTS.
  kj::Promise<std::string> createJob(kj::StringPtr jobId, JobDescription description = {}) override;

  // The registry's jobs (Resolver::jobs()). Rejects like resolve().
  kj::Promise<kj::Array<JobInfo>> jobs() override;
  kj::Maybe<kj::Own<JobControlOffer>> serveJobControl(kj::StringPtr jobId,
                                                      std::string jobCredential,
                                                      std::string logLocation,
                                                      kj::Own<JobControl> control) override;
  kj::Promise<void> stopJob(kj::StringPtr jobId, kj::Duration grace,
                            std::string credential) override;
  kj::Promise<LogPiece> readJobLog(kj::StringPtr jobId, uint32_t replica, uint64_t offset,
                                   uint32_t maxBytes) override;

private:
  kj::Own<resolver_detail::RegistryLink> link;
};

}  // namespace troupe
