#include "troupe/resolver/detail/etcd_registration.h"

#include <openssl/sha.h>

#include <kj/encoding.h>

#include "troupe/net/credentials.h"
#include "troupe/resolver/detail/etcd_watch.h"

namespace troupe::resolver_detail {

using schema::etcd::Compare;
using schema::etcd::RangeResponse;
using schema::etcd::TxnRequest;
using schema::etcd::TxnResponse;

// How often a write whose compare failed (another client wrote in between) is read and tried
// again before the registration counts it as a failure and backs off.
constexpr uint32_t WRITE_TRIES = 8;

std::string credentialDigest(kj::ArrayPtr<const kj::byte> credential) {
  kj::byte digest[SHA256_DIGEST_LENGTH];
  SHA256(credential.begin(), credential.size(), digest);
  auto hex = kj::encodeHex(kj::arrayPtr(digest, sizeof(digest)));
  return std::string(hex.begin(), hex.size());
}

void authorizeJob(const EtcdJobRecord& job, kj::StringPtr jobId,
                  kj::ArrayPtr<const kj::byte> credential, kj::StringPtr what) {
  if (credential.size() > MAX_JOB_CREDENTIAL_BYTES) {
    throwError(ErrorCode::INVALID_ARGUMENT,
               kj::str("cannot ", what, ": the job credential presented is ", credential.size(),
                       " bytes; at most ", MAX_JOB_CREDENTIAL_BYTES, " are accepted"));
  }
  if (job.owner.empty()) return;
  auto presented = credentialDigest(credential);
  if (credential.size() == 0 ||
      !sameSecret(kj::StringPtr(presented).asBytes(), kj::StringPtr(job.owner).asBytes())) {
    throwError(ErrorCode::PERMISSION_DENIED,
               kj::str("only the owner of job '", jobId, "' may ", what,
                       ", and the job credential ",
                       credential.size() == 0 ? "was not presented (TROUPE_JOB_TOKEN_FILE)"
                                              : "presented is not the job's"));
  }
}

EtcdJobRecord jobRecordFrom(EtcdClient& client, kj::StringPtr jobId, RangeResponse::Reader range) {
  EtcdJobRecord record;
  if (range.getKvs().size() == 0) return record;
  auto kv = range.getKvs()[0];
  record.exists = true;
  record.modRevision = kv.getModRevision();
  // A value that is not troupe's counts as open and running; troupe's next write replaces it.
  KJ_IF_MAYBE(job, decodeJob(client, jobId, kv.getValue())) {
    record.owner = kj::mv(job->owner);
    record.reason = kj::mv(job->status.reason);
    record.state = job->status.state;
    record.description = kj::mv(job->description);
    record.createdAtMillis = job->createdAtMillis;
    record.endedAtMillis = job->endedAtMillis;
  }
  return record;
}

void compareHeld(Compare::Builder compare, const std::string& key, int64_t lease) {
  compare.setKey(bytesOf(key));
  compare.setResult(Compare::Result::EQUAL);
  compare.setTarget(Compare::Target::LEASE);
  compare.setLease(lease);
}

void compareUnchanged(Compare::Builder compare, const std::string& key, int64_t modRevision) {
  compare.setKey(bytesOf(key));
  compare.setResult(Compare::Result::EQUAL);
  if (modRevision == 0) {
    compare.setTarget(Compare::Target::VERSION);
    compare.setVersion(0);
  } else {
    compare.setTarget(Compare::Target::MOD);
    compare.setModRevision(modRevision);
  }
}

EtcdRegistration::EtcdRegistration(kj::Own<EtcdClient> clientIn, Endpoint endpointIn)
    : client(kj::mv(clientIn)),
      session(client->session()),
      endpoint(kj::mv(endpointIn)),
      registered(nullptr) {
  auto paf = kj::newPromiseAndFulfiller<void>();
  registered = paf.promise.fork();
  registeredFulfiller = kj::mv(paf.fulfiller);
  session.join();
  if (fillNameParts(endpoint)) {
    key = client->endpointKey(endpoint.name);
    attempt();
  } else {
    phase = Phase::STOPPED;
    registeredFulfiller->reject(
        makeError(ErrorCode::INVALID_ARGUMENT, errorMessage(endpointNameError(endpoint.name))));
  }
}

EtcdRegistration::~EtcdRegistration() noexcept(false) {
  session.release(*this);
  // A write still in flight may yet land: the key goes after it is answered. A registration
  // that never sent one (refused before) has no key to delete.
  KJ_IF_MAYBE(w, writing) {
    session.leave(key, lease, w->addBranch().ignoreResult().catch_([](kj::Exception&&) {}));
  } else {
    session.leave(key, 0, kj::READY_NOW);
  }
}

void EtcdRegistration::taskFailed(kj::Exception&& exception) {
  client->log->warn("etcd: the registration of '{}' failed: {}", endpoint.name,
                    exception.getDescription().cStr());
}

kj::Promise<void> EtcdRegistration::whenRegistered() { return registered.addBranch(); }

void EtcdRegistration::setState(EndpointState state) {
  if (endpoint.state == state) return;
  endpoint.state = state;
  if (phase != Phase::HELD) return;  // the next write carries it
  auto gen = ++generation;
  tasks.add(rewrite().then([]() {},
                           [this, gen](kj::Exception&& e) {
                             if (gen == generation) failed(kj::mv(e));
                           }));
}

void EtcdRegistration::lost(int64_t lostLease, kj::StringPtr why) {
  if (phase != Phase::HELD || lostLease != lease) return;
  client->log->debug("etcd: '{}' lost its registration ({}); registering again", endpoint.name,
                     why.cStr());
  attempt();
}

void EtcdRegistration::attempt() {
  session.release(*this);
  phase = Phase::REGISTERING;
  auto gen = ++generation;
  tasks.add(session.lease()
                .then([this, gen](int64_t granted) -> kj::Promise<void> {
                  if (gen != generation) return kj::READY_NOW;
                  lease = granted;
                  return write(0);
                })
                .then(
                    [this, gen]() {
                      if (gen == generation) held();
                    },
                    [this, gen](kj::Exception&& e) {
                      if (gen == generation) failed(kj::mv(e));
                    }));
}

void EtcdRegistration::held() {
  phase = Phase::HELD;
  failures = 0;
  session.hold(*this);
  if (!everRegistered) {
    everRegistered = true;
    registeredFulfiller->fulfill();
  }
  client->log->info("etcd: registered '{}' at {} (incarnation {}, lease {})", endpoint.name,
                    endpoint.address, endpoint.incarnation, lease);
}

kj::Promise<bool> EtcdRegistration::send(kj::String txn) {
  // The fork outlives this registration (its drop waits for the answer): it refers to the
  // client only.
  auto sent = client->postJson("/v3/kv/txn", kj::mv(txn))
                  .then([client = kj::addRef(*client)](kj::String body) mutable {
                    auto reply = client->decode<TxnResponse>(body);
                    return reply.get().getSucceeded() ? reply.get().getHeader().getRevision()
                                                      : int64_t{0};
                  })
                  .fork();
  auto answered = sent.addBranch();
  writing = kj::mv(sent);
  return answered.then([this](int64_t revision) {
    if (revision == 0) return false;
    writtenAt = revision;
    return true;
  });
}

int64_t EtcdRegistration::heldAt(RangeResponse::Reader range) {
  auto current = range.getKvs();
  if (current.size() == 0) return 0;
  int64_t held = current[0].getModRevision();
  // Its own last write is rewritten; anyone else's entry only by a newer incarnation.
  if (current[0].getLease() == lease && held == writtenAt) return held;
  KJ_IF_MAYBE(other, decodeEndpoint(*client, key.c_str(), current[0].getValue())) {
    if (endpoint.incarnation <= other->incarnation) {
      throwError(ErrorCode::NAME_TAKEN,
                 kj::str("'", endpoint.name, "' is held by a live registration of incarnation ",
                         other->incarnation, " at ", other->address, " (this one has incarnation ",
                         endpoint.incarnation, "); only a newer incarnation replaces it"));
    }
  }
  return held;
}

kj::Promise<void> EtcdRegistration::write(uint32_t tries) {
  // Read the job's record and the key's holder, decide, then write only if neither changed.
  capnp::MallocMessageBuilder message;
  auto read = message.initRoot<TxnRequest>();
  auto ops = read.initSuccess(2);
  ops[0].initRequestRange().setKey(bytesOf(client->jobKey(endpoint.jobId)));
  ops[1].initRequestRange().setKey(bytesOf(key));
  return client->post<TxnResponse>("/v3/kv/txn", read.asReader())
      .then([this, tries](EtcdReply<TxnResponse>&& reply) -> kj::Promise<void> {
        auto responses = reply.get().getResponses();
        auto job = jobRecordFrom(*client, endpoint.jobId, responses[0].getResponseRange());
        auto& credentials = *client->credentials;
        auto presented = credentials.jobTokenFor(endpoint.jobId);
        auto what = kj::str("register '", endpoint.name, "'");
        authorizeJob(job, endpoint.jobId, presented, what);
        if (job.state == JobState::ENDED) {
          throwError(ErrorCode::JOB_ENDED,
                     kj::str("job '", endpoint.jobId, "' has ended (", printable(job.reason),
                             "); its endpoints cannot register"));
        }
        int64_t held = heldAt(responses[1].getResponseRange());

        endpoint.registeredAtMillis = (client->loop.calendarNow() - kj::UNIX_EPOCH) /
                                      kj::MILLISECONDS;
        capnp::MallocMessageBuilder valueMessage;
        endpoint.toCapnp(valueMessage.initRoot<schema::Endpoint>());
        auto value = client->encode(valueMessage.getRoot<schema::Endpoint>().asReader());

        capnp::MallocMessageBuilder message;
        auto txn = message.initRoot<TxnRequest>();
        auto compares = txn.initCompare(2);
        compareUnchanged(compares[0], client->jobKey(endpoint.jobId), job.modRevision);
        compareUnchanged(compares[1], key, held);
        bool claim = job.owner.empty() && presented.size() > 0;
        auto success = txn.initSuccess(claim ? 2 : 1);
        auto put = success[0].initRequestPut();
        put.setKey(bytesOf(key));
        put.setValue(value.asBytes());
        put.setLease(lease);
        kj::String jobValue;
        if (claim) {
          // The first registration that presents a credential claims an open job with it.
          capnp::MallocMessageBuilder jobMessage;
          auto record = jobMessage.initRoot<schema::etcd::Job>();
          record.setState("running");
          record.setOwner(credentialDigest(presented));
          jobValue = client->encode(record.asReader());
          auto putJob = success[1].initRequestPut();
          putJob.setKey(bytesOf(client->jobKey(endpoint.jobId)));
          putJob.setValue(jobValue.asBytes());
        }
        return send(client->encode(txn.asReader()))
            .then([this, tries](bool written) -> kj::Promise<void> {
              if (written) return kj::READY_NOW;
              if (tries + 1 >= WRITE_TRIES) {
                return makeError(ErrorCode::OVERLOADED,
                                 kj::str("'", endpoint.name, "' was written by others ",
                                         WRITE_TRIES, " times while it registered"));
              }
              return write(tries + 1);
            });
      });
}

kj::Promise<void> EtcdRegistration::rewrite() {
  capnp::MallocMessageBuilder valueMessage;
  endpoint.toCapnp(valueMessage.initRoot<schema::Endpoint>());
  auto value = client->encode(valueMessage.getRoot<schema::Endpoint>().asReader());
  capnp::MallocMessageBuilder message;
  auto txn = message.initRoot<TxnRequest>();
  compareHeld(txn.initCompare(1)[0], key, lease);
  auto put = txn.initSuccess(1)[0].initRequestPut();
  put.setKey(bytesOf(key));
  put.setValue(value.asBytes());
  put.setLease(lease);
  return send(client->encode(txn.asReader())).then([](bool written) {
    if (!written) {
      throwError(ErrorCode::LEASE_LOST,
                 "its key is gone or another lease's (a newer incarnation, or its job ended)");
    }
  });
}

void EtcdRegistration::failed(kj::Exception&& e) {
  auto code = errorCode(e);
  bool wasHeld = phase == Phase::HELD;
  session.release(*this);
  if (code == ErrorCode::INVALID_ARGUMENT || code == ErrorCode::PERMISSION_DENIED ||
      ((code == ErrorCode::JOB_ENDED || code == ErrorCode::NAME_TAKEN) && !everRegistered)) {
    phase = Phase::STOPPED;
    ++generation;
    client->log->warn("etcd: '{}' is not registered: {}", endpoint.name, e.getDescription().cStr());
    if (!everRegistered) registeredFulfiller->reject(kj::mv(e));
    return;
  }
  if (wasHeld && code == ErrorCode::LEASE_LOST) {
    client->log->warn("etcd: lost the registration of '{}' ({}); registering again", endpoint.name,
                      e.getDescription().cStr());
    attempt();
    return;
  }
  // A write may have failed because the lease is gone: the session asks etcd now, not at its
  // next keepalive.
  session.verify(lease);
  phase = Phase::REGISTERING;
  auto delay = client->backoff(failures++);
  if (failures == 1) {
    client->log->warn("etcd: cannot {} '{}' ({}); retrying with backoff",
                      wasHeld ? "update" : "register", endpoint.name, e.getDescription().cStr());
  }
  auto gen = ++generation;
  tasks.add(client->loop.timer().afterDelay(delay).then([this, gen]() {
    if (gen == generation) attempt();
  }));
}

}  // namespace troupe::resolver_detail
