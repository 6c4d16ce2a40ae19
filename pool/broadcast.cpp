#include "troupe/pool/broadcast.h"

#include <kj/debug.h>

#include "troupe/base/errors.h"
#include "troupe/pool/detail/broadcast_state.h"

namespace troupe {

using pool_detail::BroadcastState;

BroadcastFutureBase::BroadcastFutureBase(kj::Own<BroadcastState> state) : state(kj::mv(state)) {}
BroadcastFutureBase::BroadcastFutureBase(BroadcastFutureBase&&) noexcept = default;
BroadcastFutureBase& BroadcastFutureBase::operator=(BroadcastFutureBase&&) noexcept = default;
BroadcastFutureBase::~BroadcastFutureBase() noexcept(false) = default;

size_t BroadcastFutureBase::size() const { return state.get() == nullptr ? 0 : state->size(); }

kj::Own<BroadcastState> BroadcastFutureBase::take() {
  if (state.get() == nullptr) {
    throwError(ErrorCode::INVALID_ARGUMENT, "this broadcast's results were taken already");
  }
  return kj::mv(state);
}

kj::Promise<kj::Array<BroadcastFutureBase::Result>> BroadcastFutureBase::waitAll(
    kj::Duration deadline) && {
  auto s = take();
  auto expired = s->loop.timer().afterDelay(deadline).then(
      [&state = *s, deadline]() { state.expire(deadline); });
  auto& ref = *s;
  return ref.whenAllDone().exclusiveJoin(kj::mv(expired)).then([s = kj::mv(s)]() mutable {
    return s->takeAll();
  });
}

kj::Promise<BroadcastFutureBase::Result> BroadcastFutureBase::waitAny() && {
  return BroadcastState::any(take());
}

kj::Promise<kj::Array<BroadcastFutureBase::Result>> BroadcastFutureBase::waitQuorum(
    size_t k, kj::Duration deadline) && {
  auto s = take();
  auto expired = s->loop.timer().afterDelay(deadline).then(
      [&state = *s, k, deadline]() -> kj::Promise<kj::Array<Result>> {
        return makeError(ErrorCode::DEADLINE_EXCEEDED,
                         kj::str("quorum of ", k, " not reached within ",
                                 deadline / kj::MILLISECONDS, " ms (", state.successCount(),
                                 " succeeded, ", state.failureCount(), " failed)"));
      });
  auto& ref = *s;
  return BroadcastState::quorum(kj::addRef(ref), k)
      .exclusiveJoin(kj::mv(expired))
      .attach(kj::mv(s));
}

kj::Promise<kj::Maybe<BroadcastFutureBase::Result>> BroadcastFutureBase::next() {
  if (state.get() == nullptr) {
    throwError(ErrorCode::INVALID_ARGUMENT, "this broadcast's results were taken already");
  }
  return BroadcastState::next(kj::addRef(*state));
}

}  // namespace troupe
