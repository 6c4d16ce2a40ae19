#pragma once
// BroadcastFuture<V>: the results of one call made to every member of a pool at once.

#include <kj/async.h>

#include "troupe/pool/call_result.h"

namespace troupe {

namespace pool_detail {
class BroadcastState;
}  // namespace pool_detail

// The untyped part of BroadcastFuture<V>: its results carry their responses as AnyResponse.
class BroadcastFutureBase {
public:
  using Result = CallResult<kj::Own<AnyResponse>>;

  BroadcastFutureBase(BroadcastFutureBase&&) noexcept;
  BroadcastFutureBase& operator=(BroadcastFutureBase&&) noexcept;
  ~BroadcastFutureBase() noexcept(false);

  // How many members were called.
  size_t size() const;

  // The untyped forms of BroadcastFuture<V>'s methods.
  kj::Promise<kj::Array<Result>> waitAll(kj::Duration deadline) &&;
  kj::Promise<Result> waitAny() &&;
  kj::Promise<kj::Array<Result>> waitQuorum(size_t k, kj::Duration deadline) &&;
  kj::Promise<kj::Maybe<Result>> next();

private:
  friend class ActorPoolBase;  // makes them
  explicit BroadcastFutureBase(kj::Own<pool_detail::BroadcastState> state);

  // The state, left null: the results are being taken by one of the wait methods.
  kj::Own<pool_detail::BroadcastState> take();

  kj::Own<pool_detail::BroadcastState> state;
};

// Returned by ActorPool::broadcast(). Belongs to the loop's thread. Consume it one way: move it
// into one of waitAll(), waitAny() or waitQuorum() (`kj::mv(future).waitAll(...)`), or call
// next() repeatedly; each takes the results it returns. The calls run until they finish or until
// the future and every promise it returned are dropped.
template <typename V>
class BroadcastFuture {
public:
  explicit BroadcastFuture(BroadcastFutureBase base) : base(kj::mv(base)) {}

  // How many members were called.
  size_t size() const { return base.size(); }

  // Resolves when every member has answered or `deadline` (one overall deadline, measured from
  // this call) has passed, with one result per member in the order of the members' names;
  // members still running at the deadline get DEADLINE_EXCEEDED and their calls are cancelled.
  kj::Promise<kj::Array<CallResult<V>>> waitAll(kj::Duration deadline) && {
    return kj::mv(base).waitAll(deadline).then(
        [](kj::Array<BroadcastFutureBase::Result>&& all) { return unwrapAll(kj::mv(all)); });
  }

  // Resolves with the first successful result; rejects with the last error when every member
  // failed, or with NO_ENDPOINTS when there were none.
  kj::Promise<CallResult<V>> waitAny() && {
    return kj::mv(base).waitAny().then(
        [](BroadcastFutureBase::Result&& r) { return unwrapResult<V>(kj::mv(r)); });
  }

  // Resolves with `k` successful results as soon as that many members succeeded (the other
  // calls keep running while the promise lives). Rejects with the members' errors as soon as
  // fewer than `k` can still succeed, and with DEADLINE_EXCEEDED after `deadline`.
  kj::Promise<kj::Array<CallResult<V>>> waitQuorum(size_t k, kj::Duration deadline) && {
    return kj::mv(base)
        .waitQuorum(k, deadline)
        .then([](kj::Array<BroadcastFutureBase::Result>&& all) { return unwrapAll(kj::mv(all)); });
  }

  // The next result to complete, in completion order; null once all were taken.
  kj::Promise<kj::Maybe<CallResult<V>>> next() {
    return base.next().then(
        [](kj::Maybe<BroadcastFutureBase::Result>&& r) -> kj::Maybe<CallResult<V>> {
          KJ_IF_MAYBE(result, r) {
            return unwrapResult<V>(kj::mv(*result));
          }
          return nullptr;
        });
  }

private:
  static kj::Array<CallResult<V>> unwrapAll(kj::Array<BroadcastFutureBase::Result>&& all) {
    return KJ_MAP(r, all) { return unwrapResult<V>(kj::mv(r)); };
  }

  BroadcastFutureBase base;
};

}  // namespace troupe
