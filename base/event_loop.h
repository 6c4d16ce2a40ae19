#pragma once
// troupe::EventLoop: one per thread. A libuv loop that drives kj's event loop, so Cap'n Proto
// (connections, calls, promises, timers) and libuv (signals, child processes, the thread pool)
// share one thread and one epoll set.

#include <uv.h>

#include <initializer_list>
#include <memory>
#include <type_traits>
#include <typeinfo>

#include <kj/async-io.h>
#include <kj/debug.h>
#include <kj/function.h>
#include <kj/timer.h>

#include "troupe/base/metrics.h"
#include "troupe/base/random.h"

namespace spdlog {
class logger;
}

namespace troupe {

namespace base_detail {
class UvEventPort;
class UvLowLevelIo;

// Work handed to the libuv thread pool by EventLoop::offload().
class OffloadTask {
public:
  virtual ~OffloadTask() noexcept(false) = default;
  // Runs on a pool thread; must not throw (implementations catch and keep the exception).
  virtual void run() noexcept = 0;
};

}  // namespace base_detail

struct EventLoopOptions {
  // Where troupe components built on this loop log unless their own options name a logger.
  // Default: nullptr, meaning newLogger() (logging.h): a logger named "troupe" on stderr at the
  // level TROUPE_LOG_LEVEL says (info unless told). The library never writes to spdlog's global
  // default logger.
  std::shared_ptr<spdlog::logger> logger;

  // Seed of the loop's random source (random()), which components on the loop draw their
  // jitter from. Default: none, meaning a fresh seed from std::random_device; set one for runs
  // that repeat exactly.
  kj::Maybe<uint64_t> randomSeed;

  // Whether the loop keeps time by hand, for tests. Default: false: timer() follows the system's
  // monotonic clock and calendarNow() its real-time clock. When true, both stand still until
  // EventLoop::advanceTime() moves them, so a test decides when deadlines, leases, renewals,
  // backoffs and the buffer cache's trim come due, however busy the machine is. Everything else
  // stays real: sockets, pipes, signals, child processes, offload() and cross-thread work run
  // as on any loop (and anything timed in another process keeps that process's own clock).
  bool manualClock = false;
};

// Owns a uv_loop_t, the kj::EventLoop it drives and kj's async I/O on top of it. Construct one
// per thread, at the top of main() or of the thread function; the constructing thread becomes
// the loop's thread, and every object made from this loop (streams, timers, RPC connections,
// ActorServer, ActorRef) belongs to it and must be dropped before it. A thread that already has
// a kj event loop cannot construct one.
//
// The loop runs while a promise is waited on (`promise.wait(loop.waitScope())`): kj runs its
// queue, and when the queue is empty the thread blocks in libuv until I/O, a timer, a signal, a
// thread-pool completion or a cross-thread wake-up arrives.
//
// Time comes from the loop, never from a clock a component reads by itself: timer() for
// intervals and deadlines, calendarNow() for wall-clock stamps. On a loop made with
// `manualClock` both move only through advanceTime(); a wait() on a promise that only a timer
// would resolve then blocks until I/O or another thread wakes the loop, so a test advances the
// clock first and waits after.
class EventLoop {
public:
  explicit EventLoop(EventLoopOptions options = {});

  // Tears down kj's objects, then closes every libuv handle and the loop itself. Throws if libuv
  // reports handles still open (something made from this loop outlived it).
  ~EventLoop() noexcept(false);

  KJ_DISALLOW_COPY(EventLoop);

  // Pass to Promise::wait(). Only on the loop's thread, never from inside a callback.
  kj::WaitScope& waitScope();

  // kj's async I/O on this loop: network (tcp and unix addresses), pipes, and the same timer as
  // timer().
  kj::AsyncIoProvider& io();
  kj::LowLevelAsyncIoProvider& lowLevelIo();
  kj::Network& network();

  // The loop's monotonic clock and its timers; every component built on this loop measures its
  // deadlines, timeouts, leases and backoffs with it. Lives as long as the loop; loop thread
  // only. Real clock: now() reads the system's monotonic clock when called (it is not cached per
  // turn), and a timer fires on the first loop iteration at or after its time (libuv's
  // millisecond resolution, never early). Manual clock: now() stands still between
  // advanceTime() calls; a timer is fired by the advanceTime() that reaches its time, and one
  // asked for a time already reached resolves at once.
  kj::Timer& timer();

  // Wall-clock ("calendar") time, kj::UNIX_EPOCH plus the time since, for stamps that must mean
  // something outside this process (incarnations, registration times). Real clock: the system's
  // real-time clock, nanosecond resolution, which jumps when the system time is set. Manual
  // clock: the real time when the loop was made plus everything advanceTime() has added since,
  // so it keeps step with timer() and two reads without an advance between them are equal.
  // Loop thread only.
  kj::Date calendarNow() const;

  // Moves a manual clock forward by `delay` (zero or more) and fires every timer due by the new
  // time, earliest first (timers due at the same time in the order they were set). Their
  // continuations run the next time the loop runs (a wait() or a poll()), and all of them see
  // the new now(): one that sets a further timer measures it from there, so one long step fires
  // a repeating timer once, not once per period. To let a renewal or retry loop run as it would
  // in real time, advance in steps no longer than its period and poll between them. Throws
  // (KJ_REQUIRE) on a loop without `manualClock`, or for a negative `delay`. Loop thread only;
  // may be called from inside a callback.
  void advanceTime(kj::Duration delay);

  // Whether this loop was made with `manualClock`.
  bool hasManualClock() const;

  // Lets other threads run work on this loop (executeSync / executeAsync). The returned object
  // lives as long as the loop; it may be used from any thread.
  const kj::Executor& executor();

  // The libuv loop, for code that adds its own libuv handles. Loop thread only.
  uv_loop_t* uvLoop();

  // The logger components fall back to (never null).
  const std::shared_ptr<spdlog::logger>& logger() const;

  // The metrics sources on this loop (servers, pools, the registry): what server.metrics() and
  // the HTTP endpoint's /metrics read. Lives as long as the loop; loop thread only.
  MetricsSet& metrics();

  // A part of a higher layer that keeps one object per loop (net's default credentials,
  // loopCredentials() in net/credentials.h): derive from Service and take `EventLoop&` in the
  // constructor.
  class Service {
  public:
    virtual ~Service() noexcept(false) = default;
  };

  // This loop's one `T` (a Service), made as `T(*this)` on the first call and kept until the
  // loop goes. Services are destroyed first when the loop is, the last made first, while kj and
  // libuv are still up. Loop thread only.
  template <typename T>
  T& service();

  // The random source of components on this loop (jitter), seeded by
  // EventLoopOptions::randomSeed. Loop thread only.
  Random& random();

  // Runs `fn` on a libuv thread-pool thread and resolves on this loop with its result (or
  // rejects with what it threw). `fn` must not touch objects of this loop. Dropping the promise
  // before `fn` starts cancels it; once started it runs to completion and its result is
  // discarded. The pool is libuv's, shared by the process (UV_THREADPOOL_SIZE threads, default 4).
  template <typename Fn>
  auto offload(Fn&& fn) -> kj::Promise<std::invoke_result_t<Fn&>>;

  // Resolves with the signal number when one of `signals` is delivered to the process. libuv's
  // handler is installed when this is called and removed at the first delivery or when the
  // promise is dropped. While installed, the signals lose their default effect (termination);
  // after the first delivery they have it again, so a second Ctrl-C stops the process at once.
  kj::Promise<int> onSignal(std::initializer_list<int> signals);

private:
  kj::Maybe<Service&> findService(const std::type_info& type);
  Service& addService(const std::type_info& type, kj::Own<Service> service);
  kj::Promise<kj::Own<base_detail::OffloadTask>> offloadTask(
      kj::Own<base_detail::OffloadTask> task);

  struct Impl;
  kj::Own<Impl> impl;
};

// ---------------------------------------------------------------------------------------------
// Implementation details below this line.

template <typename Fn>
auto EventLoop::offload(Fn&& fn) -> kj::Promise<std::invoke_result_t<Fn&>> {
  using R = std::invoke_result_t<Fn&>;
  using Stored = std::conditional_t<std::is_void_v<R>, kj::_::Void, R>;

  class Task final : public base_detail::OffloadTask {
  public:
    explicit Task(Fn&& fn) : fn(kj::fwd<Fn>(fn)) {}
    void run() noexcept override {
      error = kj::runCatchingExceptions([this]() {
        if constexpr (std::is_void_v<R>) {
          fn();
          result = kj::_::Void();
        } else {
          result = fn();
        }
      });
    }
    std::decay_t<Fn> fn;
    kj::Maybe<Stored> result;
    kj::Maybe<kj::Exception> error;
  };

  return offloadTask(kj::heap<Task>(kj::fwd<Fn>(fn)))
      .then([](kj::Own<base_detail::OffloadTask>&& done) -> kj::Promise<R> {
        auto& task = kj::downcast<Task>(*done);
        KJ_IF_MAYBE(e, task.error) {
          return kj::mv(*e);
        }
        if constexpr (std::is_void_v<R>) {
          return kj::READY_NOW;
        } else {
          return kj::mv(KJ_ASSERT_NONNULL(task.result));
        }
      });
}

template <typename T>
T& EventLoop::service() {
  static_assert(std::is_base_of_v<Service, T>, "a loop service derives from EventLoop::Service");
  KJ_IF_MAYBE(found, findService(typeid(T))) {
    return kj::downcast<T>(*found);
  }
  return kj::downcast<T>(addService(typeid(T), kj::heap<T>(*this)));
}

}  // namespace troupe
