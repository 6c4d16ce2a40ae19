#pragma once
// troupe::EventLoop: one per thread. A libuv loop that drives kj's event loop, so Cap'n Proto
// (connections, calls, promises, timers) and libuv (signals, child processes, the thread pool)
// share one thread and one epoll set.

#include <uv.h>

#include <initializer_list>
#include <memory>
#include <type_traits>

#include <kj/async-io.h>
#include <kj/debug.h>
#include <kj/function.h>
#include <kj/timer.h>

#include "troupe/actor/random.h"

namespace spdlog {
class logger;
}

namespace troupe {

namespace detail {
class UvEventPort;
class UvLowLevelIo;

// Work handed to the libuv thread pool by EventLoop::offload().
class OffloadTask {
public:
  virtual ~OffloadTask() noexcept(false) = default;
  // Runs on a pool thread; must not throw (implementations catch and keep the exception).
  virtual void run() noexcept = 0;
};

}  // namespace detail

struct EventLoopOptions {
  // Where troupe components built on this loop log unless their own options name a logger.
  // Default: nullptr, meaning a logger that discards everything (the library never writes to
  // spdlog's global default logger; main() chooses).
  std::shared_ptr<spdlog::logger> logger;

  // Seed of the loop's random source (random()), which components on the loop draw their
  // jitter from. Default: none, meaning a fresh seed from std::random_device; set one for runs
  // that repeat exactly.
  kj::Maybe<uint64_t> randomSeed;
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
class EventLoop {
public:
  explicit EventLoop(EventLoopOptions options = {});

  // Tears down kj's objects, then closes every libuv handle and the loop itself. Throws if libuv
  // reports handles still open (something made from this loop outlived it).
  ~EventLoop() noexcept(false);

  KJ_DISALLOW_COPY(EventLoop);

  // Pass to Promise::wait(). Only on the loop's thread, never from inside a callback.
  kj::WaitScope& waitScope();

  // kj's async I/O on this loop: network (tcp and unix addresses), pipes, timer.
  kj::AsyncIoProvider& io();
  kj::LowLevelAsyncIoProvider& lowLevelIo();
  kj::Network& network();
  kj::Timer& timer();

  // Lets other threads run work on this loop (executeSync / executeAsync). The returned object
  // lives as long as the loop; it may be used from any thread.
  const kj::Executor& executor();

  // The libuv loop, for code that adds its own libuv handles. Loop thread only.
  uv_loop_t* uvLoop();

  // The logger components fall back to (never null).
  const std::shared_ptr<spdlog::logger>& logger() const;

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
  kj::Promise<kj::Own<detail::OffloadTask>> offloadTask(kj::Own<detail::OffloadTask> task);

  struct Impl;
  kj::Own<Impl> impl;
};

// ---------------------------------------------------------------------------------------------
// Implementation details below this line.

template <typename Fn>
auto EventLoop::offload(Fn&& fn) -> kj::Promise<std::invoke_result_t<Fn&>> {
  using R = std::invoke_result_t<Fn&>;
  using Stored = std::conditional_t<std::is_void_v<R>, kj::_::Void, R>;

  class Task final : public detail::OffloadTask {
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
      .then([](kj::Own<detail::OffloadTask>&& done) -> kj::Promise<R> {
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

}  // namespace troupe
