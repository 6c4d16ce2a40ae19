#include "troupe/resolver/detail/etcd_watch.h"

#include <set>

#include "troupe/schemas/actor.capnp.h"

namespace troupe::resolver_detail {

namespace {

bool startsWith(const std::string& s, const std::string& prefix) {
  return s.compare(0, prefix.size(), prefix) == 0;
}

}  // namespace

kj::Maybe<Endpoint> decodeEndpoint(EtcdClient& client, kj::StringPtr key,
                                   capnp::Data::Reader value) {
  auto name = key.slice(client.endpointsPrefix.size());
  kj::Maybe<Endpoint> result;
  KJ_IF_MAYBE(e, kj::runCatchingExceptions([&]() {
                auto reply = client.decode<schema::Endpoint>(value.asChars());
                auto endpoint = Endpoint::fromCapnp(reply.get());
                if (parseEndpointName(name) == nullptr) {
                  throwError(ErrorCode::INVALID_ARGUMENT, "its key is not an endpoint name");
                }
                if (endpoint.name != std::string(name.cStr()) || !fillNameParts(endpoint)) {
                  throwError(ErrorCode::INVALID_ARGUMENT,
                             kj::str("its value names '", printable(endpoint.name), "'"));
                }
                result = kj::mv(endpoint);
              })) {
    client.log->warn("etcd: skipped key '{}', which is not a troupe endpoint: {}",
                     printable(key).cStr(), errorMessage(*e).cStr());
    return nullptr;
  }
  return result;
}

kj::Maybe<EtcdJobValue> decodeJob(EtcdClient& client, kj::StringPtr jobId,
                                  capnp::Data::Reader value) {
  kj::Maybe<EtcdJobValue> result;
  KJ_IF_MAYBE(e, kj::runCatchingExceptions([&]() {
                validateJobId(jobId);
                auto reply = client.decode<schema::etcd::Job>(value.asChars());
                auto job = reply.get();
                EtcdJobValue decoded{{jobId.cStr(), JobState::RUNNING, job.getReason()},
                                     job.getOwner(),
                                     {job.getLauncher(), job.getReplicas()},
                                     job.getCreatedAtMillis(),
                                     job.getEndedAtMillis()};
                if (job.getState() == "ended") {
                  decoded.status.state = JobState::ENDED;
                } else if (job.getState() != "running") {
                  throwError(ErrorCode::INVALID_ARGUMENT,
                             kj::str("its state is '", printable(job.getState()), "'"));
                }
                result = kj::mv(decoded);
              })) {
    client.log->warn("etcd: the value of job '{}' is not troupe's ({}); the job counts as open "
                     "and running",
                     printable(jobId).cStr(), errorMessage(*e).cStr());
    return nullptr;
  }
  return result;
}

kj::Promise<EtcdEndpoints> readEndpoints(EtcdClient& client, kj::StringPtr prefix) {
  auto key = client.endpointKey(prefix);
  capnp::MallocMessageBuilder message;
  auto request = message.initRoot<schema::etcd::RangeRequest>();
  request.setKey(bytesOf(key));
  request.setRangeEnd(bytesOf(prefixRangeEnd(key)));
  return client.post<schema::etcd::RangeResponse>("/v3/kv/range", request.asReader())
      .then([client = kj::addRef(client)](EtcdReply<schema::etcd::RangeResponse>&& reply) mutable {
        auto response = reply.get();
        kj::Vector<Endpoint> found;
        for (auto kv : response.getKvs()) {
          auto key = stringOf(kv.getKey());
          KJ_IF_MAYBE(endpoint, decodeEndpoint(*client, key.c_str(), kv.getValue())) {
            found.add(kj::mv(*endpoint));
          }
        }
        // etcd ranges are sorted by key, so by name.
        return EtcdEndpoints{response.getHeader().getRevision(), found.releaseAsArray()};
      });
}

// ------------------------------------------------------------------------------------------------
// EtcdWatch

EtcdWatch::EtcdWatch(kj::Own<EtcdClient> clientIn, std::string prefixIn)
    : prefix(kj::mv(prefixIn)), client(kj::mv(clientIn)) {
  client->hub().add(*this);
  starting = start().eagerlyEvaluate(nullptr);
}

EtcdWatch::~EtcdWatch() noexcept(false) { client->hub().remove(*this); }

kj::Promise<void> EtcdWatch::start() {
  // A watch's first snapshot is its own range, so that it reflects every write made before the
  // watch began, whatever the hub's stream has read so far.
  return readEndpoints(*client, prefix.c_str())
      .then(
          [this](EtcdEndpoints&& read) -> kj::Promise<void> {
            for (auto& endpoint : read.endpoints) {
              queue.push(WatchEvent{WatchEvent::Type::ADDED, endpoint, {}});
              view.emplace(endpoint.name, kj::mv(endpoint));
            }
            queue.push(WatchEvent{WatchEvent::Type::SYNCED, {}, {}});
            since = read.revision;
            started = true;
            auto early = kj::mv(pending);
            apply(early);
            return kj::READY_NOW;
          },
          [this](kj::Exception&& e) -> kj::Promise<void> {
            auto delay = client->backoff(failures++);
            if (failures == 1) {
              client->log->warn("etcd: cannot read '{}' for a watch ({}); retrying with backoff",
                                prefix, e.getDescription().cStr());
            }
            return client->loop.timer().afterDelay(delay).then([this]() { return start(); });
          });
}

void EtcdWatch::apply(const std::vector<EtcdChange>& changes) {
  if (!started) {
    pending.insert(pending.end(), changes.begin(), changes.end());
    return;
  }
  for (auto& change : changes) {
    if (change.revision <= since) continue;
    applyOne(change);
  }
  if (!changes.empty()) since = std::max(since, changes.back().revision);
}

void EtcdWatch::applyOne(const EtcdChange& change) {
  switch (change.kind) {
    case EtcdChange::Kind::PUT: {
      if (!startsWith(change.name, prefix)) return;
      auto it = view.find(change.name);
      if (it == view.end()) {
        view.emplace(change.name, change.endpoint);
        queue.push(WatchEvent{WatchEvent::Type::ADDED, change.endpoint, {}});
      } else if (!(it->second == change.endpoint)) {
        it->second = change.endpoint;
        queue.push(WatchEvent{WatchEvent::Type::CHANGED, change.endpoint, {}});
      }
      return;
    }
    case EtcdChange::Kind::DELETE: {
      auto it = view.find(change.name);
      if (it == view.end()) return;
      auto gone = kj::mv(it->second);
      view.erase(it);
      queue.push(WatchEvent{WatchEvent::Type::REMOVED, kj::mv(gone), {}});
      return;
    }
    case EtcdChange::Kind::JOB_ENDED: {
      kj::StringPtr jobId = change.job.jobId;
      if (!jobOverlapsPrefix(jobId, prefix)) return;
      // Its endpoints went in the same transaction, before this.
      queue.push(WatchEvent{WatchEvent::Type::JOB_ENDED, {}, change.job});
      return;
    }
  }
}

void EtcdWatch::reconcile(const EtcdSnapshot& snapshot, bool afterBreak) {
  if (!started) return;                   // its own first snapshot is on its way
  if (snapshot.revision < since) return;  // older than what it reported already
  auto report = [&](WatchEvent event) { queue.push(kj::mv(event)); };
  std::set<std::string> endedWithEndpoints;
  for (auto it = view.begin(); it != view.end();) {
    if (snapshot.endpoints.count(it->first) == 0) {
      if (snapshot.endedJobs.count(it->second.jobId) > 0) {
        endedWithEndpoints.insert(it->second.jobId);
      }
      report(WatchEvent{WatchEvent::Type::REMOVED, it->second, {}});
      it = view.erase(it);
    } else {
      ++it;
    }
  }
  for (auto& job : endedWithEndpoints) {
    report(WatchEvent{WatchEvent::Type::JOB_ENDED, {}, snapshot.endedJobs.at(job)});
  }
  for (auto it = snapshot.endpoints.lower_bound(prefix);
       it != snapshot.endpoints.end() && startsWith(it->first, prefix); ++it) {
    auto mine = view.find(it->first);
    if (mine == view.end()) {
      view.emplace(it->first, it->second);
      report(WatchEvent{WatchEvent::Type::ADDED, it->second, {}});
    } else if (!(mine->second == it->second)) {
      mine->second = it->second;
      report(WatchEvent{WatchEvent::Type::CHANGED, it->second, {}});
    }
  }
  // After a break the watch says it is current again. What the hub's first read finds that the
  // watch's own had not are ordinary changes, made while the two reads raced: no SYNCED for them.
  if (afterBreak) queue.push(WatchEvent{WatchEvent::Type::SYNCED, {}, {}});
  since = snapshot.revision;
}

// ------------------------------------------------------------------------------------------------
// EtcdWatchHub

EtcdWatchHub::~EtcdWatchHub() noexcept(false) {}

void EtcdWatchHub::add(EtcdWatch& watch) {
  watches.add(watch);
  if (watches.size() == 1) {
    failures = 0;
    revision = 0;
    running = run().eagerlyEvaluate(nullptr);
  }
}

void EtcdWatchHub::remove(EtcdWatch& watch) {
  watches.remove(watch);
  if (watches.size() == 0) running = nullptr;
}

kj::Promise<EtcdSnapshot> EtcdWatchHub::readAll() {
  capnp::MallocMessageBuilder message;
  auto request = message.initRoot<schema::etcd::RangeRequest>();
  request.setKey(bytesOf(client.rootPrefix));
  request.setRangeEnd(bytesOf(prefixRangeEnd(client.rootPrefix)));
  return client.post<schema::etcd::RangeResponse>("/v3/kv/range", request.asReader())
      .then([this](EtcdReply<schema::etcd::RangeResponse>&& reply) {
        auto response = reply.get();
        EtcdSnapshot snapshot;
        snapshot.revision = response.getHeader().getRevision();
        for (auto kv : response.getKvs()) {
          auto key = stringOf(kv.getKey());
          if (startsWith(key, client.endpointsPrefix)) {
            KJ_IF_MAYBE(endpoint, decodeEndpoint(client, key.c_str(), kv.getValue())) {
              snapshot.endpoints.emplace(endpoint->name, kj::mv(*endpoint));
            }
          } else if (startsWith(key, client.jobsPrefix)) {
            auto jobId = key.substr(client.jobsPrefix.size());
            KJ_IF_MAYBE(job, decodeJob(client, jobId.c_str(), kv.getValue())) {
              if (job->status.state == JobState::ENDED) {
                snapshot.endedJobs.emplace(jobId, kj::mv(job->status));
              }
            }
          }
        }
        return snapshot;
      });
}

std::vector<EtcdChange> EtcdWatchHub::changesIn(schema::etcd::WatchResponse::Reader response) {
  std::vector<EtcdChange> changes, jobs;
  for (auto event : response.getEvents()) {
    auto kv = event.getKv();
    auto key = stringOf(kv.getKey());
    int64_t rev = kv.getModRevision();
    bool put = event.getType() == schema::etcd::Event::Type::PUT;
    if (startsWith(key, client.endpointsPrefix)) {
      auto name = key.substr(client.endpointsPrefix.size());
      if (!put) {
        changes.push_back(EtcdChange{EtcdChange::Kind::DELETE, rev, name, {}, {}});
        continue;
      }
      KJ_IF_MAYBE(endpoint, decodeEndpoint(client, key.c_str(), kv.getValue())) {
        changes.push_back(EtcdChange{EtcdChange::Kind::PUT, rev, name, kj::mv(*endpoint), {}});
      }
    } else if (put && startsWith(key, client.jobsPrefix)) {
      auto jobId = key.substr(client.jobsPrefix.size());
      KJ_IF_MAYBE(job, decodeJob(client, jobId.c_str(), kv.getValue())) {
        if (job->status.state == JobState::ENDED) {
          jobs.push_back(EtcdChange{EtcdChange::Kind::JOB_ENDED, rev, {}, {}, kj::mv(job->status)});
        }
      }
    }
  }
  // A job's end deletes its endpoints in the same revision: their REMOVED events come first.
  changes.insert(changes.end(), jobs.begin(), jobs.end());
  return changes;
}

kj::Promise<void> EtcdWatchHub::run() {
  return readAll()
      .then([this](EtcdSnapshot&& snapshot) {
        revision = snapshot.revision;
        for (auto& watch : watches) watch.reconcile(snapshot, broke);
        broke = false;
        capnp::MallocMessageBuilder message;
        auto create = message.initRoot<schema::etcd::WatchRequest>().initCreateRequest();
        create.setKey(bytesOf(client.rootPrefix));
        create.setRangeEnd(bytesOf(prefixRangeEnd(client.rootPrefix)));
        create.setStartRevision(revision + 1);
        return client.stream(
            "/v3/watch", client.encode(message.getRoot<schema::etcd::WatchRequest>().asReader()));
      })
      .then([this](kj::Own<EtcdStream> stream) {
        auto member = stream->member;
        return follow(kj::mv(stream)).exclusiveJoin(watchdog(member));
      })
      .catch_([this](kj::Exception&& e) { return retryLater(kj::mv(e)); });
}

kj::Promise<void> EtcdWatchHub::follow(kj::Own<EtcdStream> stream) {
  auto& s = *stream;
  return s.next().then([this, stream = kj::mv(stream)](
                           kj::Maybe<kj::String> object) mutable -> kj::Promise<void> {
    KJ_IF_MAYBE(text, object) {
      auto reply = client.decode<schema::etcd::WatchResult>(*text);
      auto result = reply.get();
      if (result.hasError()) {
        auto error = result.getError();
        return makeError(errorCodeOfGrpc(error.getCode()),
                         kj::str("etcd ended the watch: ", error.getMessage()));
      }
      auto response = result.getResult();
      if (response.getCanceled()) {
        return makeError(ErrorCode::DISCONNECTED,
                         kj::str("etcd cancelled the watch (compacted to revision ",
                                 response.getCompactRevision(), "): ", response.getCancelReason()));
      }
      failures = 0;
      auto changes = changesIn(response);
      if (!changes.empty()) {
        revision = std::max(revision, changes.back().revision);
        for (auto& watch : watches) watch.apply(changes);
      }
      return follow(kj::mv(stream));
    }
    return makeError(ErrorCode::DISCONNECTED, "etcd closed the watch stream");
  });
}

kj::Promise<void> EtcdWatchHub::watchdog(size_t member) {
  return client.loop.timer()
      .afterDelay(client.options.requestTimeout)
      .then([this]() {
        capnp::MallocMessageBuilder message;
        auto request = message.initRoot<schema::etcd::RangeRequest>();
        request.setKey(bytesOf(client.rootPrefix));
        request.setRangeEnd(bytesOf(prefixRangeEnd(client.rootPrefix)));
        request.setCountOnly(true);
        return client.postJson("/v3/kv/range", client.encode(request.asReader()))
            .ignoreResult()
            .catch_([](kj::Exception&&) {});  // what matters is where it went
      })
      .then([this, member]() -> kj::Promise<void> {
        if (client.currentMember() != member) {
          return makeError(ErrorCode::DISCONNECTED,
                           "the etcd member the watch streams from stopped answering");
        }
        return watchdog(member);
      });
}

kj::Promise<void> EtcdWatchHub::retryLater(kj::Exception&& why) {
  broke = true;
  auto delay = client.backoff(failures++);
  if (failures == 1) {
    client.log->warn("etcd: the watch on '{}' broke ({}); reading again and reconciling",
                     client.rootPrefix, why.getDescription().cStr());
  } else {
    client.log->debug("etcd: the watch on '{}' broke again ({}); retrying in {} ms",
                      client.rootPrefix, why.getDescription().cStr(), delay / kj::MILLISECONDS);
  }
  return client.loop.timer().afterDelay(delay).then([this]() { return run(); });
}

}  // namespace troupe::resolver_detail
