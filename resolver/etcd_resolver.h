#pragma once
// EtcdResolver: the Resolver contract on etcd v3, through etcd's JSON gateway (HTTP/1.1), so
// that discovery survives the loss of any one process. Same semantics as RegistryResolver:
// leases, incarnations, job states, watches that reconcile.

#include <memory>
#include <string>
#include <vector>

#include <kj/time.h>

#include "troupe/base/event_loop.h"
#include "troupe/net/credentials.h"
#include "troupe/resolver/resolver.h"

namespace troupe {

namespace resolver_detail {
class EtcdClient;
}

struct EtcdResolverOptions {
  // The etcd members, tried in order: "tcp://HOST:PORT", "tls://HOST:PORT" or "unix:PATH"
  // (troupe addresses). A request that cannot reach one goes to the next. A tls:// member is
  // spoken to over TLS with `credentials`: their CA must have signed the member's certificate
  // (for HOST, or for TlsOptions::serverName), and their certificate, when they hold one, is
  // presented to it (etcd's --client-cert-auth; with etcd's authentication on, its common name
  // is the etcd user).
  std::vector<std::string> members;

  // Every key troupe writes is under "<root>/": "<root>/endpoints/<endpoint name>" and
  // "<root>/jobs/<job id>". Default "troupe".
  std::string root = "troupe";

  // TTL of the registrations' lease: an endpoint whose process stopped refreshing it (frozen,
  // partitioned, killed) is removed this long after the last refresh. etcd counts whole seconds, so
  // it is rounded up to one. Default 10 s.
  kj::Duration ttl = 10 * kj::SECONDS;

  // Waits between attempts after a failure (registering, watching again), doubling from the
  // first to the last, each with random jitter. Defaults 100 ms and 1 s.
  kj::Duration backoffInitial = 100 * kj::MILLISECONDS;
  kj::Duration backoffMax = 1 * kj::SECONDS;

  // Deadline of each request to etcd, connecting included (a watch's stream has none). Default
  // 5 s.
  kj::Duration requestTimeout = 5 * kj::SECONDS;

  // Requests in flight at once (each holds a connection of its own); later ones wait their turn,
  // so that a thousand watches starting together open a few connections, not a thousand. A
  // watch's stream does not count. Default 16.
  size_t maxRequestsInFlight = 16;

  // Largest response accepted, and largest object on a watch stream, in bytes. Default 64 MiB.
  uint64_t maxResponseBytes = uint64_t{64} << 20;

  // Where the resolver logs (registrations, retries, lost leases). Default: the loop's logger.
  std::shared_ptr<spdlog::logger> logger;

  // What registrations present as their job's credential (its job token), and the TLS
  // settings for tls:// members. Default: null, meaning the loop's (loopCredentials(),
  // from TROUPE_TLS_CA, TROUPE_TLS_CERT and TROUPE_TLS_KEY).
  std::shared_ptr<Credentials> credentials;
};

// Belongs to the loop it was made on; everything it hands out is used on that loop's thread.
// Registrations and watches keep the resolver's connections alive: they go on working after
// the resolver is dropped, and each ends when dropped itself.
//
// What is in etcd: each registration is a key attached to the resolver's one lease of
// options.ttl (shared by every registration it made, however many), kept alive by one keepalive
// a third of the TTL apart. After each keepalive the resolver checks, 64 keys to a request, that
// every key is still on the lease; a key deleted or overwritten behind its back is written
// again (or refused, if a newer incarnation holds it). When etcd says the lease is gone (it
// lapsed while this process was frozen, or etcd lost its data), a new one is granted and every
// key is written again by itself. Dropping a registration deletes its key (only while it is on
// this resolver's lease), so its endpoint is gone at once; dropping the last revokes the lease.
// A newer incarnation replaces an entry in a compare-and-swap transaction, and the old
// holder's later delete leaves it alone. Ending a job writes its state and deletes its endpoints in
// one transaction; a registration under an ended job is refused with JOB_ENDED.
//
// Watches: all watches of one resolver share one etcd watch on "<root>/" and a copy of what is
// under it, so a process watching a thousand prefixes holds one stream. When the stream breaks
// or etcd cancels it (compaction), the resolver reads everything again and reconciles: ADDED,
// CHANGED and REMOVED for what differs, then SYNCED.
//
// Job ownership: createJob() stores a hash of the credential it returns, and this resolver
// refuses registrations and job changes without it (PERMISSION_DENIED), in the same
// transaction as the write. That stops careless clients, not hostile ones: anyone who may write
// to etcd may write under the root: keep strangers out of etcd with TLS and client
// certificates (tls:// members, etcds:// URLs), or serve it only where they cannot reach it.
class EtcdResolver final : public Resolver {
public:
  // Throws INVALID_ARGUMENT when options name no member or a member is not a troupe address, or
  // the root is not printable ASCII without spaces. Does not connect yet.
  EtcdResolver(EventLoop& loop, EtcdResolverOptions options);
  ~EtcdResolver() noexcept(false);
  KJ_DISALLOW_COPY(EtcdResolver);

  // Options from a URL: "etcd://HOST:PORT[,HOST:PORT...][/ROOT][?ttl_ms=N]" (PORT defaults to
  // 2379, ROOT to "troupe"), the same with "etcds://" for TLS to every member, or
  // "etcd+unix:PATH[,PATH...][?root=ROOT&ttl_ms=N]". Throws INVALID_ARGUMENT naming the part
  // that does not parse.
  static EtcdResolverOptions parseUrl(kj::StringPtr url);

  kj::Promise<kj::Array<Endpoint>> resolve(kj::StringPtr prefix) override;
  kj::Own<Watch> watch(kj::StringPtr prefix) override;
  kj::Own<Registration> registerEndpoint(Endpoint endpoint) override;
  kj::Promise<JobStatus> jobStatus(kj::StringPtr jobId) override;
  kj::Promise<void> setJobStatus(JobStatus status, std::string jobCredential = {}) override;
  kj::Promise<std::string> createJob(kj::StringPtr jobId, JobDescription description = {}) override;
  // One read of every job record and every endpoint under the root.
  kj::Promise<kj::Array<JobInfo>> jobs() override;

private:
  kj::Own<resolver_detail::EtcdClient> client;
};

}  // namespace troupe
