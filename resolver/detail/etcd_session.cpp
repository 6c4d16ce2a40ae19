#include "troupe/resolver/detail/etcd_session.h"

#include <vector>

#include "troupe/resolver/detail/etcd_client.h"

namespace troupe::resolver_detail {

using schema::etcd::TxnRequest;
using schema::etcd::TxnResponse;

// Keys checked per transaction after a keepalive (etcd allows 128 operations in one by default).
constexpr size_t KEYS_PER_CHECK = 64;

EtcdSession::EtcdSession(EtcdClient& client) : client(client), grant(nullptr) {}

EtcdSession::~EtcdSession() noexcept(false) {}

void EtcdSession::taskFailed(kj::Exception&& exception) {
  client.log->warn("etcd: keeping the lease alive failed: {}", exception.getDescription().cStr());
}

int64_t EtcdSession::ttlSeconds() const {
  // etcd counts whole seconds: round up, to one at least.
  int64_t seconds = (client.options.ttl + kj::SECONDS - 1 * kj::NANOSECONDS) / kj::SECONDS;
  return seconds < 1 ? 1 : seconds;
}

kj::Duration EtcdSession::interval() const { return ttlSeconds() * kj::SECONDS / 3; }

void EtcdSession::join() { ++users; }

void EtcdSession::leave(const std::string& key, int64_t lease, kj::Promise<void> settled) {
  KJ_ASSERT(users > 0);
  if (--users == 0 && current != 0) {
    // The last registration: revoking the lease deletes every key still on it at once.
    auto last = current;
    current = 0;
    ++generation;
    revoke(last);
    return;
  }
  if (lease == 0 || lease != current) return;  // its key is not (or no longer) on a live lease
  // Delete the key only while this lease holds it: a newer incarnation's entry stays.
  capnp::MallocMessageBuilder message;
  auto txn = message.initRoot<TxnRequest>();
  auto compare = txn.initCompare(1)[0];
  compare.setKey(bytesOf(key));
  compare.setResult(schema::etcd::Compare::Result::EQUAL);
  compare.setTarget(schema::etcd::Compare::Target::LEASE);
  compare.setLease(lease);
  txn.initSuccess(1)[0].initRequestDeleteRange().setKey(bytesOf(key));
  auto log = client.log;
  settled
      .then([&client = client, body = client.encode(txn.asReader())]() mutable {
        return client.postJson("/v3/kv/txn", kj::mv(body)).ignoreResult();
      })
      .attach(kj::addRef(client))
      .detach([log, key](kj::Exception&& e) {
        log->warn("etcd: could not delete '{}' ({}); it goes when the lease does", key,
                  e.getDescription().cStr());
      });
}

void EtcdSession::revoke(int64_t lease) {
  capnp::MallocMessageBuilder message;
  message.initRoot<schema::etcd::LeaseRevokeRequest>().setId(lease);
  auto log = client.log;
  client
      .postJson("/v3/lease/revoke",
                client.encode(message.getRoot<schema::etcd::LeaseRevokeRequest>().asReader()))
      .ignoreResult()
      .attach(kj::addRef(client))
      .detach([log, lease](kj::Exception&& e) {
        log->warn("etcd: could not revoke lease {} ({}); its keys go after its TTL", lease,
                  e.getDescription().cStr());
      });
}

kj::Promise<int64_t> EtcdSession::lease() {
  if (current != 0) return current;
  if (!granting) {
    granting = true;
    capnp::MallocMessageBuilder message;
    auto request = message.initRoot<schema::etcd::LeaseGrantRequest>();
    request.setTtl(ttlSeconds());
    grant = client.post<schema::etcd::LeaseGrantResponse>("/v3/lease/grant", request.asReader())
                .then(
                    [this](EtcdReply<schema::etcd::LeaseGrantResponse>&& reply) -> int64_t {
                      granting = false;
                      auto granted = reply.get();
                      if (granted.getId() == 0) {
                        throwError(ErrorCode::FAILED,
                                   kj::str("etcd granted no lease: ", granted.getError()));
                      }
                      if (users == 0) {  // everyone left while it was granted
                        revoke(granted.getId());
                        throwError(ErrorCode::FAILED, "the lease is no longer needed");
                      }
                      current = granted.getId();
                      failures = 0;
                      client.log->info("etcd: lease {} granted (TTL {} s)", current, ttlSeconds());
                      scheduleKeepAlive(interval());
                      return current;
                    },
                    [this](kj::Exception&& e) -> int64_t {
                      granting = false;
                      kj::throwFatalException(kj::mv(e));
                    })
                .fork();
  }
  return grant.addBranch();
}

void EtcdSession::hold(Holder& holder) { holders.insert(&holder); }

void EtcdSession::release(Holder& holder) { holders.erase(&holder); }

void EtcdSession::verify(int64_t lease) {
  if (lease == 0 || lease != current || keepAliveInFlight) return;
  scheduleKeepAlive(0 * kj::SECONDS);
}

void EtcdSession::scheduleKeepAlive(kj::Duration delay) {
  auto gen = ++generation;  // a keepalive scheduled earlier does nothing
  tasks.add(client.loop.timer().afterDelay(delay).then([this, gen]() -> kj::Promise<void> {
    if (gen != generation || current == 0 || keepAliveInFlight) return kj::READY_NOW;
    return keepAlive();
  }));
}

kj::Promise<void> EtcdSession::keepAlive() {
  keepAliveInFlight = true;
  auto lease = current;
  capnp::MallocMessageBuilder message;
  message.initRoot<schema::etcd::LeaseKeepAliveRequest>().setId(lease);
  return client
      .post<schema::etcd::LeaseKeepAliveResult>(
          "/v3/lease/keepalive", message.getRoot<schema::etcd::LeaseKeepAliveRequest>().asReader())
      .then([this,
             lease](EtcdReply<schema::etcd::LeaseKeepAliveResult>&& reply) -> kj::Promise<void> {
        if (lease != current) return kj::READY_NOW;
        if (reply.get().getResult().getTtl() <= 0) {
          dropLease(lease, "etcd no longer has it: it lapsed, or etcd lost its data");
          return kj::READY_NOW;
        }
        return checkHolders(lease);
      })
      .then(
          [this, lease]() {
            keepAliveInFlight = false;
            if (lease != current) return;
            if (failures > 0) client.log->info("etcd: lease {} is kept alive again", lease);
            failures = 0;
            scheduleKeepAlive(interval());
          },
          [this, lease](kj::Exception&& e) {
            keepAliveInFlight = false;
            if (lease != current) return;
            if (failures == 0) {
              client.log->warn("etcd: cannot keep lease {} alive ({}); retrying with backoff",
                               lease, e.getDescription().cStr());
            }
            scheduleKeepAlive(client.backoff(failures++));
          });
}

kj::Promise<void> EtcdSession::checkHolders(int64_t lease) {
  std::vector<Holder*> all(holders.begin(), holders.end());
  kj::Vector<kj::Promise<void>> checks;
  for (size_t first = 0; first < all.size(); first += KEYS_PER_CHECK) {
    std::vector<Holder*> batch(all.begin() + first,
                               all.begin() + std::min(all.size(), first + KEYS_PER_CHECK));
    capnp::MallocMessageBuilder message;
    auto txn = message.initRoot<TxnRequest>();
    auto ops = txn.initSuccess(batch.size());
    for (size_t i = 0; i < batch.size(); ++i) {
      auto range = ops[i].initRequestRange();
      range.setKey(bytesOf(batch[i]->heldKey()));
      range.setKeysOnly(true);
    }
    checks.add(client.post<TxnResponse>("/v3/kv/txn", txn.asReader())
                   .then([this, lease, batch = kj::mv(batch)](EtcdReply<TxnResponse>&& reply) {
                     auto responses = reply.get().getResponses();
                     for (size_t i = 0; i < batch.size() && i < responses.size(); ++i) {
                       auto* holder = batch[i];
                       if (lease != current || holders.count(holder) == 0) continue;
                       auto kvs = responses[i].getResponseRange().getKvs();
                       if (kvs.size() == 0) {
                         holders.erase(holder);
                         holder->lost(lease, "its key was deleted (its job ended, or by hand)");
                       } else if (kvs[0].getLease() != lease) {
                         holders.erase(holder);
                         holder->lost(lease, "its key was written by another client (a newer "
                                             "incarnation)");
                       }
                     }
                   }));
  }
  return kj::joinPromises(checks.releaseAsArray());
}

void EtcdSession::dropLease(int64_t lease, kj::StringPtr why) {
  if (lease != current) return;
  current = 0;
  ++generation;
  std::vector<Holder*> told(holders.begin(), holders.end());
  holders.clear();
  client.log->warn("etcd: lease {} is gone ({}); its {} registrations register again", lease,
                   why.cStr(), told.size());
  for (auto* holder : told) holder->lost(lease, why);
}

}  // namespace troupe::resolver_detail
