#include "troupe/base/detail/uv_event_port.h"

namespace troupe {

void throwUvError(const char* what, int status) {
  kj::throwFatalException(KJ_EXCEPTION(FAILED, kj::str(what, ": ", uv_strerror(status))));
}

}  // namespace troupe

namespace troupe::base_detail {

UvTimer::UvTimer(uv_loop_t* loop) : clock(kj::systemPreciseMonotonicClock()), impl(clock.now()) {
  checkUv("uv_timer_init", uv_timer_init(loop, handle.get()));
  handle.markInitialised();
  handle->data = this;
}

void UvTimer::onFire(uv_timer_t* handle) {
  // UvEventPort fires kj's timers (advance()) once uv_run returns. libuv runs due timers before
  // it polls, and with no other timer left it would then poll with no timeout at all, so ask
  // uv_run to return after this iteration (uv_stop makes the poll non-blocking). libuv measures
  // time with a coarse clock, so this may come a little early: advance() re-arms if so.
  auto* self = static_cast<UvTimer*>(handle->data);
  if (self != nullptr) self->armed = false;
  uv_stop(handle->loop);
}

kj::TimePoint UvTimer::now() const { return clock.now(); }

kj::Promise<void> UvTimer::atTime(kj::TimePoint time) {
  auto promise = impl.atTime(time);
  if (armed && time >= armedFor) return promise;
  arm();
  return promise;
}

kj::Promise<void> UvTimer::afterDelay(kj::Duration delay) { return atTime(now() + delay); }

void UvTimer::advance() {
  KJ_IF_MAYBE(next, impl.nextEvent()) {
    auto now = clock.now();
    if (*next <= now) {
      impl.advanceTo(now);
      arm();
    } else if (!armed || armedFor != *next) {
      arm();
    }
  } else if (armed) {
    uv_timer_stop(handle.get());
    armed = false;
  }
}

void UvTimer::arm() {
  KJ_IF_MAYBE(next, impl.nextEvent()) {
    auto now = clock.now();
    uint64_t ms = 0;
    if (*next > now) {
      // Round up so that the timer never fires before its time.
      ms = (*next - now + kj::MILLISECONDS - 1 * kj::NANOSECONDS) / kj::MILLISECONDS;
    }
    // libuv measures timeouts from its cached loop time; refresh it so the timeout is not short.
    uv_update_time(handle->loop);
    checkUv("uv_timer_start", uv_timer_start(handle.get(), &UvTimer::onFire, ms, 0));
    armedFor = *next;
    armed = true;
  } else {
    uv_timer_stop(handle.get());
    armed = false;
  }
}

UvEventPort::UvEventPort(uv_loop_t* loop) : loop(loop), timer_(loop) {
  // The async handle stays referenced: while kj waits for an event, uv_run must block rather
  // than return because nothing else is active.
  checkUv("uv_async_init", uv_async_init(loop, async.get(), [](uv_async_t*) {}));
  async.markInitialised();
}

UvEventPort::~UvEventPort() noexcept(false) {}

bool UvEventPort::wait() {
  uv_run(loop, UV_RUN_ONCE);
  timer_.advance();
  return woken.exchange(false);
}

bool UvEventPort::poll() {
  uv_run(loop, UV_RUN_NOWAIT);
  timer_.advance();
  return woken.exchange(false);
}

void UvEventPort::wake() const {
  woken.store(true);
  // uv_async_send is the one libuv call that is safe from any thread.
  uv_async_send(const_cast<uv_async_t*>(async.get()));
}

}  // namespace troupe::base_detail
