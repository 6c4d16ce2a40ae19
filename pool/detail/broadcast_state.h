#pragma once
// The results of one broadcast as they arrive: shared by its BroadcastFuture and the member calls
// that feed it.

#include <deque>
#include <vector>

#include <kj/async.h>
#include <kj/refcount.h>

#include "troupe/base/change_signal.h"
#include "troupe/base/event_loop.h"
#include "troupe/pool/broadcast.h"

namespace troupe::pool_detail {

// Loop thread only.
class BroadcastState final : public kj::Refcounted {
public:
  using Result = BroadcastFutureBase::Result;

  BroadcastState(EventLoop& loop, kj::Array<Endpoint> endpoints);

  void succeeded(size_t i, kj::Own<AnyResponse>&& response);
  // Member i failed with `e`; its result's error names the member and its address.
  void failed(size_t i, kj::Exception&& e);
  // Fails every member still running with DEADLINE_EXCEEDED and cancels its call.
  void expire(kj::Duration after);

  bool isDone(size_t i) const { return slots[i].done; }
  size_t size() const { return slots.size(); }
  size_t remaining() const { return slots.size() - successes - failures; }
  // Since the broadcast started.
  kj::Duration elapsed() const { return loop.timer().now() - start; }
  size_t successCount() const { return successes; }
  size_t failureCount() const { return failures; }

  // Resolves once any member's result arrives (at once if none is to come).
  kj::Promise<void> whenChanged();
  // Resolves once every member has a result: one wake-up, not one per member.
  kj::Promise<void> whenAllDone();

  kj::Array<Result> takeAll();
  // The next completed result not taken yet, in completion order; null if none is.
  kj::Maybe<Result> takeNext();

  // BroadcastFuture's waits.
  static kj::Promise<Result> any(kj::Own<BroadcastState> s);
  static kj::Promise<kj::Array<Result>> quorum(kj::Own<BroadcastState> s, size_t k);
  static kj::Promise<kj::Maybe<Result>> next(kj::Own<BroadcastState> s);

  EventLoop& loop;
  kj::Array<kj::Promise<void>> calls;  // the member calls in flight; dropping cancels them

private:
  struct Slot {
    Result result;
    bool done = false;
  };

  Slot& finish(size_t i);
  void fail(size_t i, kj::Exception&& e);
  void notify();

  const kj::TimePoint start;
  std::vector<Slot> slots;
  std::deque<size_t> completed;  // indices not yet taken by next()
  size_t successes = 0;
  size_t failures = 0;
  ChangeSignal changed;
  ChangeSignal allDone;
};

}  // namespace troupe::pool_detail
