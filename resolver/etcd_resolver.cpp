#include "troupe/resolver/etcd_resolver.h"

#include "troupe/base/errors.h"
#include "troupe/net/credentials.h"
#include "troupe/resolver/detail/etcd_client.h"
#include "troupe/resolver/detail/etcd_registration.h"
#include "troupe/resolver/detail/etcd_watch.h"
#include "troupe/resolver/detail/job_list.h"
#include "troupe/resolver/detail/url_query.h"

namespace troupe {

using resolver_detail::bytesOf;
using resolver_detail::EtcdClient;
using resolver_detail::EtcdJobRecord;
using resolver_detail::EtcdReply;
using resolver_detail::jobRecordFrom;
using resolver_detail::prefixRangeEnd;
using schema::etcd::TxnRequest;
using schema::etcd::TxnResponse;

namespace {

// How often a job change whose compare failed is read and tried again.
constexpr uint32_t JOB_WRITE_TRIES = 8;

// Reads the job's record and how many endpoints it has, in one request.
struct JobRead {
  EtcdJobRecord record;
  int64_t endpoints = 0;
};

kj::Promise<JobRead> readJob(EtcdClient& client, std::string jobId) {
  capnp::MallocMessageBuilder message;
  auto txn = message.initRoot<TxnRequest>();
  auto ops = txn.initSuccess(2);
  ops[0].initRequestRange().setKey(bytesOf(client.jobKey(jobId)));
  auto prefix = client.endpointKey(jobId) + "/";
  auto count = ops[1].initRequestRange();
  count.setKey(bytesOf(prefix));
  count.setRangeEnd(bytesOf(prefixRangeEnd(prefix)));
  count.setCountOnly(true);
  return client.post<TxnResponse>("/v3/kv/txn", txn.asReader())
      .then([&client, jobId](EtcdReply<TxnResponse>&& reply) {
        auto responses = reply.get().getResponses();
        JobRead read;
        read.record = jobRecordFrom(client, jobId, responses[0].getResponseRange());
        read.endpoints = responses[1].getResponseRange().getCount();
        return read;
      });
}

int64_t nowMillis(EtcdClient& client) {
  return (client.loop.calendarNow() - kj::UNIX_EPOCH) / kj::MILLISECONDS;
}

// The job's new value: `record` (as read) with the state, reason and owner given.
kj::String jobValue(EtcdClient& client, const EtcdJobRecord& record, JobState state,
                    kj::StringPtr reason, kj::StringPtr owner) {
  capnp::MallocMessageBuilder message;
  auto job = message.initRoot<schema::etcd::Job>();
  job.setState(state == JobState::ENDED ? "ended" : "running");
  job.setReason(reason);
  job.setOwner(owner);
  job.setLauncher(record.description.launcher);
  job.setReplicas(record.description.replicas);
  job.setCreatedAtMillis(record.createdAtMillis != 0 ? record.createdAtMillis : nowMillis(client));
  job.setEndedAtMillis(state == JobState::ENDED ? nowMillis(client) : 0);
  return client.encode(job.asReader());
}

// Writes the job's new record if it is unchanged since `read` (and, ending it, deletes its
// endpoints in the same transaction); false if someone wrote in between.
kj::Promise<bool> writeJob(EtcdClient& client, const std::string& jobId, const JobRead& read,
                           kj::StringPtr value, bool deleteEndpoints) {
  capnp::MallocMessageBuilder message;
  auto txn = message.initRoot<TxnRequest>();
  auto compare = txn.initCompare(1);
  resolver_detail::compareUnchanged(compare[0], client.jobKey(jobId), read.record.modRevision);
  auto ops = txn.initSuccess(deleteEndpoints ? 2 : 1);
  if (deleteEndpoints) {
    // The endpoints go first, so that watchers see them REMOVED before the job ENDED.
    auto prefix = client.endpointKey(jobId) + "/";
    auto doomed = ops[0].initRequestDeleteRange();
    doomed.setKey(bytesOf(prefix));
    doomed.setRangeEnd(bytesOf(prefixRangeEnd(prefix)));
  }
  auto put = ops[deleteEndpoints ? 1 : 0].initRequestPut();
  put.setKey(bytesOf(client.jobKey(jobId)));
  put.setValue(value.asBytes());
  return client.post<TxnResponse>("/v3/kv/txn", txn.asReader())
      .then([](EtcdReply<TxnResponse>&& reply) { return reply.get().getSucceeded(); });
}

kj::Promise<void> setJobStatusIn(EtcdClient& client, JobStatus status, std::string credential,
                                 uint32_t tries) {
  auto jobId = status.jobId;
  return readJob(client, jobId)
      .then([&client, status = kj::mv(status), credential = kj::mv(credential),
             tries](JobRead read) mutable -> kj::Promise<void> {
        auto presented = kj::StringPtr(credential).asBytes();
        resolver_detail::authorizeJob(read.record, status.jobId, presented, "set its state");
        std::string owner = read.record.owner;
        if (owner.empty() && presented.size() > 0)
          owner = resolver_detail::credentialDigest(presented);
        bool ending = status.state == JobState::ENDED;
        if (!ending && (!read.record.exists || read.record.state == JobState::RUNNING) &&
            owner == read.record.owner) {
          return kj::READY_NOW;  // running already, nothing to claim
        }
        auto reason = ending ? cutJobReason(status.reason) : std::string();
        auto value = jobValue(client, read.record, status.state, reason, owner);
        auto write = writeJob(client, status.jobId, read, value, ending);
        return write.then([&client, status = kj::mv(status), credential = kj::mv(credential), tries,
                           reason = kj::mv(reason)](bool written) mutable -> kj::Promise<void> {
          if (written) {
            if (status.state == JobState::ENDED) {
              client.log->info("etcd: job '{}' ended ({}); its endpoints are removed", status.jobId,
                               printable(reason).cStr());
            }
            return kj::READY_NOW;
          }
          if (tries + 1 >= JOB_WRITE_TRIES) {
            return makeError(ErrorCode::OVERLOADED,
                             kj::str("job '", status.jobId, "' was written by others ",
                                     JOB_WRITE_TRIES, " times while its state was being set"));
          }
          return setJobStatusIn(client, kj::mv(status), kj::mv(credential), tries + 1);
        });
      });
}

kj::Promise<std::string> createJobIn(EtcdClient& client, std::string jobId,
                                     JobDescription description, uint32_t tries) {
  return readJob(client, jobId)
      .then([&client, jobId, description = kj::mv(description),
             tries](JobRead read) mutable -> kj::Promise<std::string> {
        bool ended = read.record.exists && read.record.state == JobState::ENDED;
        bool owned = read.record.exists && !read.record.owner.empty();
        if (!ended && (owned || read.endpoints > 0)) {
          throwError(ErrorCode::JOB_ALREADY_EXISTS,
                     kj::str("job '", jobId, "' already exists and is live (",
                             owned ? "created, and not ended by its owner" : "it has endpoints",
                             "): choose another name, or stop it first"));
        }
        auto credential = newJobCredential();
        EtcdJobRecord fresh;
        fresh.description = description;
        fresh.description.launcher = cutLauncherKind(description.launcher);
        auto value =
            jobValue(client, fresh, JobState::RUNNING, "",
                     resolver_detail::credentialDigest(kj::StringPtr(credential).asBytes()));
        return writeJob(client, jobId, read, value, false)
            .then([&client, jobId, description = kj::mv(description), tries,
                   credential = kj::mv(credential)](
                      bool written) mutable -> kj::Promise<std::string> {
              if (written) {
                client.log->info("etcd: job '{}' created", jobId);
                return kj::mv(credential);
              }
              if (tries + 1 >= JOB_WRITE_TRIES) {
                return makeError(ErrorCode::OVERLOADED,
                                 kj::str("job '", jobId,
                                         "' was written by others while it was "
                                         "being created"));
              }
              return createJobIn(client, jobId, kj::mv(description), tries + 1);
            });
      });
}

void badUrl(kj::StringPtr url, kj::StringPtr why) {
  throwError(ErrorCode::INVALID_ARGUMENT, kj::str("etcd URL '", printable(url), "': ", why));
}

// Applies "ttl_ms=N" and "root=R" (separated by '&') to `options`.
void applyQuery(kj::StringPtr url, kj::StringPtr query, EtcdResolverOptions& options) {
  auto bad = [&](kj::StringPtr why) { badUrl(url, why); };
  auto parts = resolver_detail::splitParts(query, '&');
  for (auto& part : parts) {
    if (part.size() == 0 && &part == &parts.back()) break;  // a trailing '&'
    if (part.startsWith("ttl_ms=")) {
      options.ttl = resolver_detail::parseTtlMillis(part.slice(strlen("ttl_ms=")), bad);
    } else if (part.startsWith("root=")) {
      options.root = part.slice(strlen("root=")).cStr();
    } else {
      badUrl(url, kj::str("unknown option '", part, "' (known: ttl_ms, root)"));
    }
  }
}

// Splits "a,b,c" into members, each made a troupe address by `address`.
template <typename Fn>
void addMembers(kj::StringPtr url, kj::StringPtr list, EtcdResolverOptions& options, Fn&& address) {
  if (list.size() == 0) badUrl(url, "names no etcd member");
  for (auto& part : resolver_detail::splitParts(list, ',')) {
    if (part.size() == 0) badUrl(url, "has an empty member in its list");
    options.members.push_back(address(part.asPtr()));
  }
}

}  // namespace

EtcdResolverOptions EtcdResolver::parseUrl(kj::StringPtr url) {
  EtcdResolverOptions options;
  kj::String query;
  auto splitQuery = [&](kj::StringPtr text) {
    KJ_IF_MAYBE(q, text.findFirst('?')) {
      query = kj::heapString(text.slice(*q + 1));
      return kj::heapString(text.slice(0, *q));
    }
    return kj::heapString(text);
  };
  if (url.startsWith("etcd+unix:")) {
    auto members = splitQuery(url.slice(strlen("etcd+unix:")));
    addMembers(url, members, options,
               [&](kj::StringPtr path) { return std::string("unix:") + path.cStr(); });
  } else if (url.startsWith("etcd://") || url.startsWith("etcds://")) {
    bool tls = url.startsWith("etcds://");
    auto body = splitQuery(url.slice(tls ? strlen("etcds://") : strlen("etcd://")));
    kj::StringPtr hosts = body;
    kj::String hostStorage;
    KJ_IF_MAYBE(slash, body.findFirst('/')) {
      hostStorage = kj::heapString(body.slice(0, *slash));
      hosts = hostStorage;
      auto root = body.slice(*slash + 1);
      if (root.size() > 0) options.root = root.cStr();
    }
    addMembers(url, hosts, options, [&](kj::StringPtr host) {
      // HOST, HOST:PORT, [V6]:PORT; the port defaults to etcd's 2379.
      bool hasPort = host.endsWith("]") ? false : host.findLast(':') != nullptr;
      if (host.startsWith("[") && !host.endsWith("]")) hasPort = true;
      return std::string(kj::str(tls ? "tls://" : "tcp://", host, hasPort ? "" : ":2379").cStr());
    });
  } else {
    badUrl(url, "expected etcd://HOST:PORT[,HOST:PORT...][/ROOT], etcds://... (TLS) or "
                "etcd+unix:PATH[,PATH...]");
  }
  if (query.size() > 0) applyQuery(url, query, options);
  return options;
}

EtcdResolver::EtcdResolver(EventLoop& loop, EtcdResolverOptions options)
    : client(kj::refcounted<EtcdClient>(loop, kj::mv(options))) {}

EtcdResolver::~EtcdResolver() noexcept(false) {}

kj::Promise<kj::Array<Endpoint>> EtcdResolver::resolve(kj::StringPtr prefix) {
  validatePrefix(prefix);
  return resolver_detail::readEndpoints(*client, prefix)
      .then([](resolver_detail::EtcdEndpoints&& read) { return kj::mv(read.endpoints); });
}

kj::Own<Watch> EtcdResolver::watch(kj::StringPtr prefix) {
  validatePrefix(prefix);
  return kj::heap<resolver_detail::EtcdWatch>(kj::addRef(*client), prefix.cStr());
}

kj::Own<Registration> EtcdResolver::registerEndpoint(Endpoint endpoint) {
  return kj::heap<resolver_detail::EtcdRegistration>(kj::addRef(*client), kj::mv(endpoint));
}

kj::Promise<JobStatus> EtcdResolver::jobStatus(kj::StringPtr jobId) {
  validateJobId(jobId);
  std::string id = jobId.cStr();
  return readJob(*client, id).attach(kj::addRef(*client)).then([id](JobRead read) {
    return JobStatus{id, read.record.state, read.record.reason};
  });
}

kj::Promise<void> EtcdResolver::setJobStatus(JobStatus status, std::string jobCredential) {
  kj::StringPtr jobId = status.jobId;
  validateJobId(jobId);
  return setJobStatusIn(*client, kj::mv(status), kj::mv(jobCredential), 0)
      .attach(kj::addRef(*client));
}

kj::Promise<std::string> EtcdResolver::createJob(kj::StringPtr jobId, JobDescription description) {
  validateJobId(jobId);
  return createJobIn(*client, jobId.cStr(), kj::mv(description), 0).attach(kj::addRef(*client));
}

kj::Promise<kj::Array<JobInfo>> EtcdResolver::jobs() {
  // The jobs' records and every endpoint, in one read.
  capnp::MallocMessageBuilder message;
  auto txn = message.initRoot<TxnRequest>();
  auto ops = txn.initSuccess(2);
  auto& c = *client;
  auto readAll = [](schema::etcd::RequestOp::Builder op, const std::string& prefix) {
    auto range = op.initRequestRange();
    range.setKey(bytesOf(prefix));
    range.setRangeEnd(bytesOf(prefixRangeEnd(prefix)));
  };
  readAll(ops[0], c.jobsPrefix);
  readAll(ops[1], c.endpointsPrefix);
  return c.post<TxnResponse>("/v3/kv/txn", txn.asReader())
      .then([client = kj::addRef(c)](EtcdReply<TxnResponse>&& reply) mutable {
        auto responses = reply.get().getResponses();
        resolver_detail::JobList list;
        for (auto kv : responses[0].getResponseRange().getKvs()) {
          auto key = resolver_detail::stringOf(kv.getKey());
          auto jobId = key.substr(client->jobsPrefix.size());
          KJ_IF_MAYBE(job, resolver_detail::decodeJob(*client, jobId.c_str(), kv.getValue())) {
            JobInfo info;
            info.status = kj::mv(job->status);
            info.launcher = kj::mv(job->description.launcher);
            info.replicas = job->description.replicas;
            info.createdAtMillis = job->createdAtMillis;
            info.endedAtMillis = job->endedAtMillis;
            list.addRecord(kj::mv(info));
          }
        }
        for (auto kv : responses[1].getResponseRange().getKvs()) {
          auto key = resolver_detail::stringOf(kv.getKey());
          KJ_IF_MAYBE(endpoint,
                      resolver_detail::decodeEndpoint(*client, key.c_str(), kv.getValue())) {
            list.count(*endpoint);
          }
        }
        return list.finish();
      });
}

}  // namespace troupe
