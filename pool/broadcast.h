#pragma once
// BroadcastFuture<V>: the results of one call made to every member of a pool at once.

#include <deque>
#include <vector>

#include <kj/async.h>
#include <kj/debug.h>
#include <kj/refcount.h>
#include <kj/vector.h>

#include "troupe/actor/endpoint.h"
#include "troupe/base/change_signal.h"
#include "troupe/base/errors.h"
#include "troupe/base/event_loop.h"

namespace troupe {

// What one member did with a broadcast call.
template <typename V>
struct CallResult {
  Endpoint endpoint;                           // the member called
  kj::Maybe<V> value;                          // the response, when the call succeeded
  kj::Maybe<kj::Exception> error;              // why it failed, otherwise (errors.h taxonomy)
  kj::Duration latency = 0 * kj::NANOSECONDS;  // from the broadcast to this result

  bool ok() const { return value != nullptr; }
};

namespace pool_detail {

// Shared by a BroadcastFuture and the member calls feeding it. Loop thread only.
template <typename V>
class BroadcastState final : public kj::Refcounted {
public:
  BroadcastState(EventLoop& loop, kj::Array<Endpoint> endpoints)
      : loop(loop), start(loop.timer().now()), slots(endpoints.size()) {
    for (size_t i = 0; i < endpoints.size(); ++i) slots[i].result.endpoint = kj::mv(endpoints[i]);
  }

  void succeeded(size_t i, V&& value) {
    auto& slot = finish(i);
    slot.result.value = kj::mv(value);
    ++successes;
    notify();
  }

  // Member i failed with `e`; its result's error names the member and its address.
  void failed(size_t i, kj::Exception&& e) {
    auto& endpoint = slots[i].result.endpoint;
    fail(i, withContext(e, kj::str(endpoint.name, " (", endpoint.address, ")")));
  }

  // Fails every member still running with DEADLINE_EXCEEDED and cancels its call.
  void expire(kj::Duration after) {
    for (size_t i = 0; i < slots.size(); ++i) {
      if (!slots[i].done) {
        auto& endpoint = slots[i].result.endpoint;
        fail(i, makeError(ErrorCode::DEADLINE_EXCEEDED,
                          kj::str("broadcast to ", endpoint.name, " (", endpoint.address,
                                  ") did not finish within ", after / kj::MILLISECONDS,
                                  " ms; it may have run")));
      }
    }
    calls = nullptr;
  }

  bool isDone(size_t i) const { return slots[i].done; }

  kj::Promise<void> whenChanged() {
    if (remaining() == 0) return kj::READY_NOW;
    return changed.next();
  }

  // Resolves once every member has a result: one wake-up, not one per member.
  kj::Promise<void> whenAllDone() {
    if (remaining() == 0) return kj::READY_NOW;
    return allDone.next();
  }

  size_t remaining() const { return slots.size() - successes - failures; }

  kj::Array<CallResult<V>> takeAll() {
    return KJ_MAP(slot, slots) { return kj::mv(slot.result); };
  }

  EventLoop& loop;
  kj::TimePoint start;
  struct Slot {
    CallResult<V> result;
    bool done = false;
  };
  std::vector<Slot> slots;
  std::deque<size_t> completed;  // indices not yet taken by next()
  size_t successes = 0;
  size_t failures = 0;
  kj::Array<kj::Promise<void>> calls;  // the member calls in flight; dropping cancels them

private:
  Slot& finish(size_t i) {
    auto& slot = slots[i];
    KJ_ASSERT(!slot.done);
    slot.done = true;
    slot.result.latency = loop.timer().now() - start;
    completed.push_back(i);
    return slot;
  }

  void fail(size_t i, kj::Exception&& e) {
    auto& slot = finish(i);
    slot.result.error = kj::mv(e);
    ++failures;
    notify();
  }

  void notify() {
    changed.notify();
    if (remaining() == 0) allDone.notify();
  }

  ChangeSignal changed;
  ChangeSignal allDone;
};

}  // namespace pool_detail

// Returned by ActorPool::broadcast(). Belongs to the loop's thread. Consume it one way: one of
// waitAll(), waitAny() or waitQuorum(), or next() repeatedly; each takes the results it returns.
// The calls run until they finish or until the future and every promise it returned are dropped.
template <typename V>
class BroadcastFuture {
  using State = pool_detail::BroadcastState<V>;

public:
  explicit BroadcastFuture(kj::Own<State> state) : state(kj::mv(state)) {}

  // How many members were called.
  size_t size() const { return state->slots.size(); }

  // Resolves when every member has answered or `deadline` (one overall deadline, measured from
  // this call) has passed, with one result per member in the order of the members' names;
  // members still running at the deadline get DEADLINE_EXCEEDED and their calls are cancelled.
  kj::Promise<kj::Array<CallResult<V>>> waitAll(kj::Duration deadline) {
    auto& s = *state;
    auto expired = s.loop.timer().afterDelay(deadline).then(
        [s = kj::addRef(s), deadline]() mutable { s->expire(deadline); });
    return s.whenAllDone().exclusiveJoin(kj::mv(expired)).then([s = kj::addRef(s)]() mutable {
      return s->takeAll();
    });
  }

  // Resolves with the first successful result; rejects with the last error when every member
  // failed, or with NO_ENDPOINTS when there were none.
  kj::Promise<CallResult<V>> waitAny() { return any(kj::addRef(*state)); }

  // Resolves with `k` successful results as soon as that many members succeeded (the other
  // calls keep running while the future lives). Rejects with the members' errors as soon as
  // fewer than `k` can still succeed, and with DEADLINE_EXCEEDED after `deadline`.
  kj::Promise<kj::Array<CallResult<V>>> waitQuorum(size_t k, kj::Duration deadline) {
    auto& s = *state;
    auto expired = s.loop.timer().afterDelay(deadline).then(
        [s = kj::addRef(s), k, deadline]() -> kj::Promise<kj::Array<CallResult<V>>> {
          return makeError(ErrorCode::DEADLINE_EXCEEDED,
                           kj::str("quorum of ", k, " not reached within ",
                                   deadline / kj::MILLISECONDS, " ms (", s->successes,
                                   " succeeded, ", s->failures, " failed)"));
        });
    return quorum(kj::addRef(s), k).exclusiveJoin(kj::mv(expired));
  }

  // The next result to complete, in completion order; null once all were taken.
  kj::Promise<kj::Maybe<CallResult<V>>> next() { return nextOf(kj::addRef(*state)); }

private:
  static kj::Promise<CallResult<V>> any(kj::Own<State> s) {
    while (!s->completed.empty()) {
      size_t i = s->completed.front();
      s->completed.pop_front();
      if (s->slots[i].result.ok()) return kj::mv(s->slots[i].result);
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

  static kj::Promise<kj::Array<CallResult<V>>> quorum(kj::Own<State> s, size_t k) {
    if (s->successes >= k) {
      kj::Vector<CallResult<V>> out;
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

  static kj::Promise<kj::Maybe<CallResult<V>>> nextOf(kj::Own<State> s) {
    if (!s->completed.empty()) {
      size_t i = s->completed.front();
      s->completed.pop_front();
      return kj::Maybe<CallResult<V>>(kj::mv(s->slots[i].result));
    }
    if (s->remaining() == 0) return kj::Maybe<CallResult<V>>(nullptr);
    auto& ref = *s;
    return ref.whenChanged().then([s = kj::mv(s)]() mutable { return nextOf(kj::mv(s)); });
  }

  kj::Own<State> state;
};

}  // namespace troupe
