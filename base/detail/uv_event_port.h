#pragma once
// The bridge between libuv and kj: kj's event queue runs on the thread, and whenever it is empty
// kj calls UvEventPort::wait(), which runs one libuv iteration (blocking in epoll). libuv's
// callbacks (sockets, timers, signals, thread-pool completions, cross-thread wake-ups) only ever
// fulfil kj promises; they never run kj's queue themselves and never re-enter uv_run.

#include <atomic>

#include <kj/async.h>
#include <kj/timer.h>

#include "troupe/base/uv_handle.h"

namespace troupe::base_detail {

// kj::Timer on a uv_timer_t. `now()` reads the monotonic clock (not a cached loop time), so a
// deadline set while the loop was busy is measured from when it was set. Timers fire with the
// millisecond resolution of libuv's timer.
class UvTimer final : public kj::Timer {
public:
  explicit UvTimer(uv_loop_t* loop);

  kj::TimePoint now() const override;
  kj::Promise<void> atTime(kj::TimePoint time) override;
  kj::Promise<void> afterDelay(kj::Duration delay) override;

  // Fires every timer whose time has come and re-arms the uv timer for the next one. Called by
  // the port after each libuv iteration.
  void advance();

private:
  static void onFire(uv_timer_t* handle);
  void arm();

  const kj::MonotonicClock& clock;
  kj::TimerImpl impl;
  UvHandle<uv_timer_t> handle;
  bool armed = false;
  kj::TimePoint armedFor = kj::origin<kj::TimePoint>();
};

class UvEventPort final : public kj::EventPort {
public:
  explicit UvEventPort(uv_loop_t* loop);
  ~UvEventPort() noexcept(false);

  bool wait() override;
  bool poll() override;
  void wake() const override;

  UvTimer& timer() { return timer_; }

private:
  uv_loop_t* loop;
  UvHandle<uv_async_t> async;
  mutable std::atomic<bool> woken{false};
  UvTimer timer_;
};

}  // namespace troupe::base_detail
