#include "troupe/pool/detail/broadcast_state.h"

#include <kj/debug.h>
#include <kj/vector.h>

#include "troupe/base/errors.h"

namespace troupe::pool_detail {

BroadcastState::BroadcastState(EventLoop& loop, kj::Array<Endpoint> endpoints)
    : loop(loop), start(loop.timer().now()), slots(endpoints.size()) {
  for (size_t i = 0; i < endpoints.size(); ++i) slots[i].result.endpoint = kj::mv(endpoints[i]);
}

void BroadcastState::succeeded(size_t i, kj::Own<AnyResponse>&& response) {
  auto& slot = finish(i);
  slot.result.value = kj::mv(response);
  ++successes;
  notify();
}

void BroadcastState::failed(size_t i, kj::Exception&& e) {
  auto& endpoint = slots[i].result.endpoint;
  fail(i, withContext(e, kj::str(endpoint.name, " (", endpoint.address, ")")));
}

void BroadcastState::expire(kj::Duration after) {
  for (size_t i = 0; i < slots.size(); ++i) {
    if (slots[i].done) continue;
    auto& endpoint = slots[i].result.endpoint;
    fail(i, makeError(ErrorCode::DEADLINE_EXCEEDED,
                      kj::str("broadcast to ", endpoint.name, " (", endpoint.address,
                              ") did not finish within ", after / kj::MILLISECONDS,
                              " ms; it may have run")));
  }
  calls = nullptr;
}

kj::Promise<void> BroadcastState::whenChanged() {
  if (remaining() == 0) return kj::READY_NOW;
  return changed.next();
}

kj::Promise<void> BroadcastState::whenAllDone() {
  if (remaining() == 0) return kj::READY_NOW;
  return allDone.next();
}

kj::Array<BroadcastState::Result> BroadcastState::takeAll() {
  return KJ_MAP(slot, slots) { return kj::mv(slot.result); };
}

kj::Maybe<BroadcastState::Result> BroadcastState::takeNext() {
  if (completed.empty()) return nullptr;
  size_t i = completed.front();
  completed.pop_front();
  return kj::mv(slots[i].result);
}

kj::Promise<BroadcastState::Result> BroadcastState::any(kj::Own<BroadcastState> s) {
  while (true) {
    KJ_IF_MAYBE(r, s->takeNext()) {
      if (r->ok()) return kj::mv(*r);
    } else {
      break;
    }
  }
  if (s->remaining() == 0) {
    kj::Maybe<kj::Exception> last;
    for (auto& slot : s->slots) {
      KJ_IF_MAYBE(e, slot.result.error) {
        last = kj::cp(*e);
      }
    }
    KJ_IF_MAYBE(e, last) {
      return kj::mv(*e);
    }
    return makeError(ErrorCode::NO_ENDPOINTS, "the broadcast reached no member");
  }
  auto& ref = *s;
  return ref.whenChanged().then([s = kj::mv(s)]() mutable { return any(kj::mv(s)); });
}

kj::Promise<kj::Array<BroadcastState::Result>> BroadcastState::quorum(kj::Own<BroadcastState> s,
                                                                      size_t k) {
  if (s->successes >= k) {
    kj::Vector<Result> out;
    for (auto& slot : s->slots) {
      if (slot.done && slot.result.ok() && out.size() < k) out.add(kj::mv(slot.result));
    }
    return out.releaseAsArray();
  }
  if (s->successes + s->remaining() < k) {
    kj::Vector<kj::String> errors;
    for (auto& slot : s->slots) {
      KJ_IF_MAYBE(e, slot.result.error) {
        errors.add(kj::str(slot.result.endpoint.name, ": ", e->getDescription()));
      }
    }
    return makeError(ErrorCode::FAILED,
                     kj::str("quorum of ", k, " of ", s->slots.size(),
                             " cannot be reached; failures: ", kj::strArray(errors, "; ")));
  }
  auto& ref = *s;
  return ref.whenChanged().then([s = kj::mv(s), k]() mutable { return quorum(kj::mv(s), k); });
}

kj::Promise<kj::Maybe<BroadcastState::Result>> BroadcastState::next(kj::Own<BroadcastState> s) {
  KJ_IF_MAYBE(r, s->takeNext()) {
    return kj::Maybe<Result>(kj::mv(*r));
  }
  if (s->remaining() == 0) return kj::Maybe<Result>(nullptr);
  auto& ref = *s;
  return ref.whenChanged().then([s = kj::mv(s)]() mutable { return next(kj::mv(s)); });
}

BroadcastState::Slot& BroadcastState::finish(size_t i) {
  auto& slot = slots[i];
  KJ_ASSERT(!slot.done);
  slot.done = true;
  slot.result.latency = loop.timer().now() - start;
  completed.push_back(i);
  return slot;
}

void BroadcastState::fail(size_t i, kj::Exception&& e) {
  auto& slot = finish(i);
  slot.result.error = kj::mv(e);
  ++failures;
  notify();
}

void BroadcastState::notify() {
  changed.notify();
  if (remaining() == 0) allDone.notify();
}

}  // namespace troupe::pool_detail
