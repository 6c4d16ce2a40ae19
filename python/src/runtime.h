#pragma once
// The Python module's event loop: one troupe EventLoop on a thread of its own, the way Python
// threads hand it work, and the way its results come back.
//
// Python threads never touch loop objects. They post() functions that run on the loop thread,
// and wait for a Completion the loop fills: with the GIL released, looking for the answer for up
// to 100 µs before sleeping (when it has more than one CPU), then waking every 50 ms to let
// Ctrl-C through (which cancels the work on the loop). asyncio waits differently: a Completion
// made with a Notifier tells it, through a file descriptor the asyncio loop reads, without the
// loop thread ever taking the GIL.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

#include <kj/async.h>
#include <kj/function.h>
#include <kj/refcount.h>

#include "troupe/base/event_loop.h"
#include "python/src/errors.h"

namespace troupe::python {

// Tells an asyncio loop which Completions finished: their tokens, and an eventfd that becomes
// readable while there are any. Thread-safe.
class Notifier final : public kj::AtomicRefcounted {
public:
  Notifier();
  ~Notifier() noexcept;
  KJ_DISALLOW_COPY(Notifier);

  int fd() const { return fd_; }
  // The tokens of the Completions finished since the last call; clears the fd.
  std::vector<uint64_t> take();
  // Loop thread: `token` finished.
  void finished(uint64_t token) const;

private:
  int fd_;
  mutable std::mutex mutex;
  mutable std::vector<uint64_t> tokens;
};

// One piece of work on the loop, as the thread that asked for it waits: done once the loop has
// called succeed() or fail(). What succeeded leaves its result in the subclass. Thread-safe.
class Completion : public kj::AtomicRefcounted {
public:
  Completion() = default;
  virtual ~Completion() noexcept(false) = default;
  KJ_DISALLOW_COPY(Completion);

  // Python thread, with the GIL held: waits until done, with the GIL released. When
  // `interruptible`, raises KeyboardInterrupt (cancelling the work) if a signal handler raised;
  // the work must then own what it uses, since the caller goes on. Returns at once if done.
  void wait(bool interruptible = true);
  bool done() const;
  // After done(): what failed, or null.
  kj::Maybe<const kj::Exception&> error() const;

  // Tells `notifier` (with `token`) when done, instead of (or as well as) a waiting thread.
  void notifyWith(kj::Own<const Notifier> notifier, uint64_t token);

  // Loop thread.
  void succeed();
  void fail(kj::Exception&& e);
  // `promise`, run on the loop: succeed() or fail() when it settles; cancel() drops it.
  void track(kj::Promise<void> promise);

  // Any thread: cancels the work (on the loop thread, soon) if it has not finished.
  void cancel();

private:
  void finish(kj::Maybe<kj::Exception> e);

  // Waits up to `limit` for done_ without sleeping. GIL released.
  bool spinUntilDone(std::chrono::microseconds limit) const;

  mutable std::mutex mutex;
  std::condition_variable cv;
  bool done_ = false;
  std::atomic<bool> finished{false};  // done_, readable without the mutex
  kj::Maybe<kj::Exception> error_;
  kj::Maybe<kj::Own<const Notifier>> notifier;
  uint64_t token = 0;
  // Loop thread only.
  kj::Canceler canceler;
};

// The process's loop thread, started on first use and stopped at exit (shutdown()).
class Runtime {
public:
  static Runtime& get();

  // Runs `fn` on the loop thread soon, in the order posted. Any thread. Returns false once the
  // loop has stopped (then `fn` is never run; whatever it holds is leaked, since loop objects
  // cannot be dropped anywhere else).
  bool post(kj::Function<void(EventLoop&)> fn);

  // Stops the loop thread and joins it: work not finished is dropped. Idempotent.
  void shutdown();

  // Whether the calling thread is the loop thread.
  bool onLoopThread() const;

  // Why post() refuses work: the loop stopped, or this process is a child fork() made after
  // the loop started (it has no loop thread, and cannot have one: the parent's objects are
  // the parent's).
  const char* stoppedReason() const;

private:
  Runtime();
  void run();
  void runPosted();
  static void beforeFork();
  static void afterForkInParent();
  static void afterForkInChild();

  std::thread thread;
  std::thread::id loopThreadId;
  std::mutex mutex;
  std::condition_variable started;
  bool running = false;
  bool stopped = false;
  bool forked = false;  // this is a child of fork(); the loop thread is the parent's
  std::vector<kj::Function<void(EventLoop&)>> posted;
  void* wake = nullptr;  // the loop's uv_async_t, while running
  EventLoop* loop = nullptr;
};

// Something kept alive on the loop for Python (LoopOwned, client.h): dropped there, when Python
// lets it go or, for what Python still holds at exit, when the loop stops (newest first).
class LoopHeld {
public:
  virtual ~LoopHeld() noexcept(false) = default;
};

// Loop thread: keeps `held` until dropHeld(the id returned), or until the loop stops.
uint64_t keepHeld(kj::Own<LoopHeld> held);
// Any thread: drops what keepHeld() returned `id` for, on the loop thread, soon.
void dropHeld(uint64_t id);

// Any thread: runs `fn` soon on a Python thread with the GIL held (the loop thread never takes
// it): after the next wait() of a Completion, or from Python's pending calls on the main
// thread, whichever comes first. For what must be let go of under the GIL (a Python buffer a
// message referred to).
void withGilSoon(kj::Function<void()> fn);
// Any thread: runs `fn` with the GIL held, for letting go of a Python object: now, or soon
// (withGilSoon()) on the loop thread, which never takes the GIL.
void withGil(kj::Function<void()> fn);
// GIL held: runs what withGilSoon() queued.
void runGilQueue();

// Posts `fn(loop)` and has `completion` track the promise it returns. Any thread.
void start(Completion& completion, kj::Function<kj::Promise<void>(EventLoop&, Completion&)> fn);

// Runs `fn` on the loop, waits for `completion` and raises what it failed with (Python thread,
// GIL held). Quick work waits without interruption and may borrow the caller's objects;
// `interruptible` work (it may wait for long) must own what it uses, since Ctrl-C lets the
// caller go on without it.
template <typename C>
void runOn(kj::Own<C>& completion, kj::Function<kj::Promise<void>(EventLoop&, C&)> fn,
           bool interruptible = false) {
  start(*completion, [fn = kj::mv(fn)](EventLoop& loop, Completion& c) mutable {
    return fn(loop, static_cast<C&>(c));
  });
  completion->wait(interruptible);
  KJ_IF_MAYBE(e, completion->error()) {
    raise(*e);
  }
}

}  // namespace troupe::python
