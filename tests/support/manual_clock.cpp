#include "tests/support/manual_clock.h"

#include <kj/debug.h>

#include "troupe/base/uv_handle.h"

namespace troupe::test {

namespace {

class RealTimeAdapter {
public:
  RealTimeAdapter(kj::PromiseFulfiller<void>& fulfiller, uv_loop_t* loop, kj::Duration delay)
      : fulfiller(fulfiller) {
    checkUv("uv_timer_init", uv_timer_init(loop, handle.get()));
    handle.markInitialised();
    handle->data = this;
    // Rounded up, from a fresh reading of libuv's clock: never early.
    auto ms = (delay + kj::MILLISECONDS - 1 * kj::NANOSECONDS) / kj::MILLISECONDS;
    uv_update_time(loop);
    checkUv("uv_timer_start", uv_timer_start(handle.get(), &RealTimeAdapter::onFire,
                                             static_cast<uint64_t>(kj::max(ms, int64_t{0})), 0));
  }

private:
  static void onFire(uv_timer_t* h) {
    auto* self = static_cast<RealTimeAdapter*>(h->data);
    if (self != nullptr) self->fulfiller.fulfill();
  }

  kj::PromiseFulfiller<void>& fulfiller;
  UvHandle<uv_timer_t> handle;
};

}  // namespace

kj::Promise<void> afterRealTime(EventLoop& loop, kj::Duration delay) {
  return kj::newAdaptedPromise<void, RealTimeAdapter>(loop.uvLoop(), delay);
}

void advanceInSteps(EventLoop& loop, kj::Duration total, kj::Duration step) {
  KJ_REQUIRE(step > 0 * kj::NANOSECONDS, "a step must move the clock", step);
  auto& ws = loop.waitScope();
  ws.poll();
  while (total > 0 * kj::NANOSECONDS) {
    auto next = kj::min(step, total);
    loop.advanceTime(next);
    ws.poll();
    total = total - next;
  }
}

}  // namespace troupe::test
