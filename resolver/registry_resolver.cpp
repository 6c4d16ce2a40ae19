#include "troupe/resolver/registry_resolver.h"

#include <kj/debug.h>

#include "troupe/base/errors.h"
#include "troupe/resolver/detail/registry_job_control.h"
#include "troupe/resolver/detail/registry_link.h"
#include "troupe/resolver/detail/registry_registration.h"
#include "troupe/resolver/detail/registry_watch.h"
#include "troupe/resolver/registry_wire.h"

namespace troupe {

namespace {

// The troupe address behind a registry URL.
kj::String registryAddress(kj::StringPtr url) {
  kj::StringPtr scheme;
  kj::StringPtr rest;
  if (url.startsWith("registry://")) {
    scheme = "tcp://";
    rest = url.slice(strlen("registry://"));
  } else if (url.startsWith("registry+tls://")) {
    scheme = "tls://";
    rest = url.slice(strlen("registry+tls://"));
  }
  if (scheme != nullptr) {
    if (rest.size() == 0) {
      throwError(ErrorCode::INVALID_ARGUMENT,
                 kj::str("registry URL '", printable(url), "' names no host"));
    }
    // A port is needed; 7700 (troupe-registry's default) when none is given.
    bool hasPort = false;
    if (rest[0] == '[') {
      KJ_IF_MAYBE(close, rest.findFirst(']')) {
        hasPort = *close + 1 < rest.size() && rest[*close + 1] == ':';
      }
    } else {
      hasPort = rest.findFirst(':') != nullptr;
    }
    return hasPort ? kj::str(scheme, rest) : kj::str(scheme, rest, ":7700");
  }
  if (url.startsWith("registry+unix:"))
    return kj::str("unix:", url.slice(strlen("registry+unix:")));
  if (url.startsWith("tcp://") || url.startsWith("tls://") || url.startsWith("unix:")) {
    return kj::str(url);
  }
  throwError(ErrorCode::INVALID_ARGUMENT,
             kj::str("'", printable(url),
                     "' is not a registry address (expected registry://HOST:PORT, "
                     "registry+tls://HOST:PORT, registry+unix:PATH, tcp://HOST:PORT, "
                     "tls://HOST:PORT or unix:PATH)"));
}

}  // namespace

RegistryResolver::RegistryResolver(EventLoop& loop, kj::StringPtr address,
                                   RegistryResolverOptions options)
    : link(kj::refcounted<resolver_detail::RegistryLink>(loop, registryAddress(address),
                                                         kj::mv(options))) {}

RegistryResolver::~RegistryResolver() noexcept(false) {}

kj::Promise<kj::Array<Endpoint>> RegistryResolver::resolve(kj::StringPtr prefix) {
  validatePrefix(prefix);
  using Response = capnp::Response<schema::Registry::ResolveResults>;
  return link
      ->call<Response>("resolve",
                       [prefix = kj::str(prefix)](schema::Registry::Client registry) {
                         auto request = registry.resolveRequest();
                         request.setPrefix(prefix);
                         return request.send();
                       })
      .then([](Response&& response) {
        auto list = response.getEndpoints();
        auto result = kj::heapArrayBuilder<Endpoint>(list.size());
        for (auto e : list) result.add(Endpoint::fromCapnp(e));
        return result.finish();
      });
}

kj::Own<Watch> RegistryResolver::watch(kj::StringPtr prefix) {
  validatePrefix(prefix);
  return kj::heap<resolver_detail::RegistryWatch>(kj::addRef(*link), prefix);
}

kj::Own<Registration> RegistryResolver::registerEndpoint(Endpoint endpoint) {
  if (fillNameParts(endpoint)) {
    return kj::heap<resolver_detail::RegistryRegistration>(kj::addRef(*link), kj::mv(endpoint));
  }
  return kj::heap<resolver_detail::RegistryRegistration>(kj::addRef(*link),
                                                         endpointNameError(endpoint.name));
}

kj::Promise<JobStatus> RegistryResolver::jobStatus(kj::StringPtr jobId) {
  validateJobId(jobId);
  using Response = capnp::Response<schema::Registry::JobStatusResults>;
  return link
      ->call<Response>("jobStatus",
                       [jobId = kj::str(jobId)](schema::Registry::Client registry) {
                         auto request = registry.jobStatusRequest();
                         request.setJobId(jobId);
                         return request.send();
                       })
      .then([](Response&& response) { return fromCapnp(response.getStatus()); });
}

kj::Promise<void> RegistryResolver::setJobStatus(JobStatus status, std::string jobCredential) {
  validateJobId(status.jobId);
  using Response = capnp::Response<schema::Registry::SetJobStatusResults>;
  return link
      ->call<Response>("setJobStatus",
                       [status = kj::mv(status),
                        credential = kj::mv(jobCredential)](schema::Registry::Client registry) {
                         auto request = registry.setJobStatusRequest();
                         toCapnp(status, request.initStatus());
                         request.setJobCredential(kj::StringPtr(credential).asBytes());
                         return request.send();
                       })
      .then([](Response&&) {});
}

kj::Promise<std::string> RegistryResolver::createJob(kj::StringPtr jobId,
                                                     JobDescription description) {
  validateJobId(jobId);
  using Response = capnp::Response<schema::Registry::CreateJobResults>;
  return link
      ->call<Response>("createJob",
                       [jobId = kj::str(jobId),
                        description = kj::mv(description)](schema::Registry::Client registry) {
                         auto request = registry.createJobRequest();
                         request.setJobId(jobId);
                         request.setLauncher(description.launcher);
                         request.setReplicas(description.replicas);
                         return request.send();
                       })
      .then([](Response&& response) {
        auto credential = response.getCredential();
        return std::string(credential.asChars().begin(), credential.size());
      });
}

kj::Promise<kj::Array<JobInfo>> RegistryResolver::jobs() {
  using Response = capnp::Response<schema::Registry::ListJobsResults>;
  return link
      ->call<Response>("listJobs",
                       [](schema::Registry::Client registry) {
                         return registry.listJobsRequest().send();
                       })
      .then([](Response&& response) {
        auto list = response.getJobs();
        auto result = kj::heapArrayBuilder<JobInfo>(list.size());
        for (auto j : list) result.add(fromCapnp(j));
        return result.finish();
      });
}

kj::Maybe<kj::Own<JobControlOffer>> RegistryResolver::serveJobControl(kj::StringPtr jobId,
                                                                      std::string jobCredential,
                                                                      std::string logLocation,
                                                                      kj::Own<JobControl> control) {
  validateJobId(jobId);
  return kj::Own<JobControlOffer>(kj::heap<resolver_detail::RegistryJobControlOffer>(
      kj::addRef(*link), jobId, kj::mv(jobCredential), kj::mv(logLocation), kj::mv(control)));
}

kj::Promise<void> RegistryResolver::stopJob(kj::StringPtr jobId, kj::Duration grace,
                                            std::string credential) {
  validateJobId(jobId);
  using Response = capnp::Response<schema::Registry::StopJobResults>;
  auto graceMillis = static_cast<uint32_t>(
      kj::min(grace / kj::MILLISECONDS, int64_t{std::numeric_limits<uint32_t>::max()}));
  // Not sent twice: a stop that may have reached the launcher is not repeated. The call waits
  // for the job to end, so its deadline is the grace on top of the registry's.
  auto target = link->registry();
  auto request = target.stopJobRequest();
  request.setJobId(jobId);
  request.setGraceMillis(graceMillis);
  request.setCredential(kj::StringPtr(credential).asBytes());
  auto sent = request.send().then([](Response&&) {});
  auto limit = grace + link->options.callTimeout;
  auto late = link->loop.timer().afterDelay(limit).then(
      [jobId = kj::str(jobId), limit]() -> kj::Promise<void> {
        return makeError(ErrorCode::DEADLINE_EXCEEDED,
                         kj::str("job '", jobId, "' did not end within ", limit / kj::MILLISECONDS,
                                 " ms of being asked to stop"));
      });
  return sent.exclusiveJoin(kj::mv(late));
}

kj::Promise<LogPiece> RegistryResolver::readJobLog(kj::StringPtr jobId, uint32_t replica,
                                                   uint64_t offset, uint32_t maxBytes) {
  validateJobId(jobId);
  using Response = capnp::Response<schema::Registry::ReadJobLogResults>;
  return link
      ->call<Response>("readJobLog",
                       [jobId = kj::str(jobId), replica, offset,
                        maxBytes](schema::Registry::Client registry) {
                         auto request = registry.readJobLogRequest();
                         request.setJobId(jobId);
                         request.setReplica(replica);
                         request.setOffset(offset);
                         request.setMaxBytes(maxBytes);
                         return request.send();
                       })
      .then([](Response&& response) {
        auto piece = response.getPiece();
        auto data = piece.getData();
        return LogPiece{std::string(data.asChars().begin(), data.size()), piece.getNext(),
                        piece.getSize(), piece.getReplicas()};
      });
}

}  // namespace troupe
