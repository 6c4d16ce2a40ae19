#pragma once
// CallResult<V>: what one member did with a call, naming the member: each member of a broadcast,
// or the last attempt of a pool call (ActorPool::callResult).

#include <kj/async.h>
#include <kj/debug.h>
#include <kj/memory.h>
#include <kj/time.h>

#include "troupe/actor/endpoint.h"

namespace troupe {

template <typename V>
struct CallResult {
  Endpoint endpoint;                           // the member called; empty when none was
  kj::Maybe<V> value;                          // the response, when the call succeeded
  kj::Maybe<kj::Exception> error;              // why it failed, otherwise (errors.h taxonomy)
  kj::Duration latency = 0 * kj::NANOSECONDS;  // from the call (or broadcast) to this result

  bool ok() const { return value != nullptr; }

  // The response, moved out; throws the error when the call failed.
  V take() {
    KJ_IF_MAYBE(e, error) {
      kj::throwFatalException(kj::cp(*e));
    }
    return kj::mv(KJ_ASSERT_NONNULL(value));
  }
};

// A response whose type the pool's untyped core does not know. ActorPoolBase and BroadcastFuture
// carry responses as kj::Own<AnyResponse>, so that their logic is compiled once for every
// response type; their typed calls wrap each response (wrapResponse) and unwrap it (unwrapResult).
class AnyResponse {
public:
  virtual ~AnyResponse() noexcept(false) = default;
};

template <typename V>
class ResponseOf final : public AnyResponse {
public:
  explicit ResponseOf(V&& value) : value(kj::mv(value)) {}
  V value;
};

template <typename V>
kj::Own<AnyResponse> wrapResponse(V&& value) {
  return kj::heap<ResponseOf<V>>(kj::mv(value));
}

// `result` with its response (if any) unwrapped; V must be the type it was wrapped with.
template <typename V>
CallResult<V> unwrapResult(CallResult<kj::Own<AnyResponse>>&& result) {
  CallResult<V> out{kj::mv(result.endpoint), nullptr, kj::mv(result.error), result.latency};
  KJ_IF_MAYBE(response, result.value) {
    out.value = kj::mv(static_cast<ResponseOf<V>&>(**response).value);
  }
  return out;
}

}  // namespace troupe
