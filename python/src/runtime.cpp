#include "python/src/runtime.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <chrono>
#include <map>

#include <kj/debug.h>
#include <pybind11/pybind11.h>
#include <spdlog/spdlog.h>

#include "troupe/base/errors.h"
#include "troupe/base/uv_handle.h"
#include "python/src/errors.h"
#include "python/src/logs.h"

namespace py = pybind11;

namespace troupe::python {

// ---------------------------------------------------------------------------------------------
// Notifier

Notifier::Notifier() : fd_(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {
  if (fd_ < 0) throwError(ErrorCode::FAILED, kj::str("eventfd: ", strerror(errno)));
}

Notifier::~Notifier() noexcept { close(fd_); }

std::vector<uint64_t> Notifier::take() {
  uint64_t count;
  // Drained before the tokens are read: a token added after this read rings the fd again.
  while (read(fd_, &count, sizeof(count)) < 0 && errno == EINTR) {
  }
  std::lock_guard<std::mutex> lock(mutex);
  return std::exchange(tokens, {});
}

void Notifier::finished(uint64_t token) const {
  bool first;
  {
    std::lock_guard<std::mutex> lock(mutex);
    first = tokens.empty();
    tokens.push_back(token);
  }
  if (first) {
    uint64_t one = 1;
    while (write(fd_, &one, sizeof(one)) < 0 && errno == EINTR) {
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Completion

namespace {

// A call on loopback often finishes within tens of microseconds, and waking a thread that went
// to sleep costs about as much on a virtual machine: a waiting thread looks for the answer
// this long before it sleeps.
constexpr std::chrono::microseconds SPIN_LIMIT{100};

int cpusAvailable() {
  static const int count = []() {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof(set), &set) != 0) return 1;
    return CPU_COUNT(&set);
  }();
  return count;
}

std::mutex gilQueueMutex;
std::vector<kj::Function<void()>> gilQueue;

}  // namespace

void withGilSoon(kj::Function<void()> fn) {
  bool first;
  {
    std::lock_guard<std::mutex> lock(gilQueueMutex);
    first = gilQueue.empty();
    gilQueue.push_back(kj::mv(fn));
  }
  // Needs neither the GIL nor a thread state. If Python's queue is full, the next wait() runs
  // it.
  if (first)
    Py_AddPendingCall(
        [](void*) {
          runGilQueue();
          return 0;
        },
        nullptr);
}

void withGil(kj::Function<void()> fn) {
  if (Runtime::get().onLoopThread()) {
    withGilSoon(kj::mv(fn));
    return;
  }
  py::gil_scoped_acquire gil;
  fn();
}

void runGilQueue() {
  std::vector<kj::Function<void()>> batch;
  {
    std::lock_guard<std::mutex> lock(gilQueueMutex);
    if (gilQueue.empty()) return;
    batch.swap(gilQueue);
  }
  for (auto& fn : batch) fn();
}

void Completion::wait(bool interruptible) {
  KJ_DEFER(runGilQueue());
  if (done()) return;
  for (bool first = true;; first = false) {
    bool over;
    {
      py::gil_scoped_release released;
      over = first && spinUntilDone(SPIN_LIMIT);
      if (!over) {
        std::unique_lock<std::mutex> lock(mutex);
        over = cv.wait_for(lock, std::chrono::milliseconds(50), [this]() { return done_; });
      }
    }
    if (over) return;
    if (!interruptible) continue;
    // A signal handler (Ctrl-C: KeyboardInterrupt) raised: give the work up.
    if (PyErr_CheckSignals() != 0) {
      cancel();
      throw py::error_already_set();
    }
  }
}

bool Completion::spinUntilDone(std::chrono::microseconds limit) const {
  // On one CPU, spinning only keeps the loop thread from running.
  if (cpusAvailable() < 2) return finished.load(std::memory_order_acquire);
  auto until = std::chrono::steady_clock::now() + limit;
  while (!finished.load(std::memory_order_acquire)) {
    if (std::chrono::steady_clock::now() >= until) return false;
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
  }
  return true;
}

bool Completion::done() const {
  std::lock_guard<std::mutex> lock(mutex);
  return done_;
}

kj::Maybe<const kj::Exception&> Completion::error() const {
  std::lock_guard<std::mutex> lock(mutex);
  return error_;
}

void Completion::notifyWith(kj::Own<const Notifier> n, uint64_t t) {
  bool already;
  {
    std::lock_guard<std::mutex> lock(mutex);
    already = done_;
    if (!already) {
      notifier = kj::mv(n);
      token = t;
    }
  }
  if (already) n->finished(t);
}

void Completion::succeed() { finish(nullptr); }

void Completion::fail(kj::Exception&& e) { finish(kj::mv(e)); }

void Completion::finish(kj::Maybe<kj::Exception> e) {
  kj::Maybe<kj::Own<const Notifier>> tell;
  uint64_t t;
  {
    std::lock_guard<std::mutex> lock(mutex);
    if (done_) return;
    done_ = true;
    error_ = kj::mv(e);
    finished.store(true, std::memory_order_release);
    tell = kj::mv(notifier);
    t = token;
  }
  cv.notify_all();
  KJ_IF_MAYBE(n, tell) {
    (*n)->finished(t);
  }
}

void Completion::cancel() {
  Runtime::get().post([self = kj::atomicAddRef(*this)](EventLoop&) mutable {
    self->canceler.cancel(makeError(ErrorCode::FAILED, "cancelled by the caller"));
  });
}

// ---------------------------------------------------------------------------------------------
// Runtime

namespace {

struct LoopState : public kj::TaskSet::ErrorHandler {
  LoopState() : tasks(kj::heap<kj::TaskSet>(static_cast<kj::TaskSet::ErrorHandler&>(*this))) {}
  kj::Own<kj::TaskSet> tasks;
  kj::Own<kj::PromiseFulfiller<void>> stop;
  std::map<uint64_t, kj::Own<LoopHeld>> held;  // by id: in the order made
  uint64_t nextHeld = 1;

private:
  // Never called: track() turns every outcome into the Completion's.
  void taskFailed(kj::Exception&&) override {}
};

thread_local LoopState* loopState = nullptr;

}  // namespace

void Completion::track(kj::Promise<void> promise) {
  auto self = kj::atomicAddRef(*this);
  auto run = canceler.wrap(kj::mv(promise))
                 .then([self = kj::atomicAddRef(*this)]() mutable { self->succeed(); },
                       [self = kj::atomicAddRef(*this)](kj::Exception&& e) mutable {
                         self->fail(kj::mv(e));
                       })
                 .attach(kj::defer([self = kj::mv(self)]() mutable {
                   // Dropped with the loop before it settled.
                   self->fail(makeError(ErrorCode::FAILED, "troupe's event loop stopped"));
                 }));
  KJ_ASSERT_NONNULL(loopState).tasks->add(kj::mv(run));
}

uint64_t keepHeld(kj::Own<LoopHeld> held) {
  auto& state = KJ_ASSERT_NONNULL(loopState);
  auto id = state.nextHeld++;
  state.held.emplace(id, kj::mv(held));
  return id;
}

void dropHeld(uint64_t id) {
  Runtime::get().post([id](EventLoop&) {
    // The posted function's own destruction is not what drops it: erase() is, right here.
    KJ_ASSERT_NONNULL(loopState).held.erase(id);
  });
}

Runtime& Runtime::get() {
  // Never destroyed: shutdown() stops the thread, and objects that outlive it are leaked on
  // purpose rather than dropped off their loop.
  static Runtime* runtime = new Runtime();
  return *runtime;
}

Runtime::Runtime() {
  // The mutex is held across fork(), so that the child finds it in a known state.
  pthread_atfork(&Runtime::beforeFork, &Runtime::afterForkInParent, &Runtime::afterForkInChild);
  thread = std::thread([this]() { run(); });
  std::unique_lock<std::mutex> lock(mutex);
  started.wait(lock, [this]() { return running || stopped; });
}

void Runtime::run() {
  kj::Maybe<kj::Exception> failure = kj::runCatchingExceptions([this]() {
    EventLoopOptions options;
    options.logger = pythonLogger();
    EventLoop eventLoop(kj::mv(options));
    LoopState state;
    loopState = &state;
    auto stop = kj::newPromiseAndFulfiller<void>();
    state.stop = kj::mv(stop.fulfiller);
    UvHandle<uv_async_t> async;
    checkUv("uv_async_init", uv_async_init(eventLoop.uvLoop(), async.get(), [](uv_async_t* h) {
              if (h->data != nullptr) static_cast<Runtime*>(h->data)->runPosted();
            }));
    async.markInitialised();
    async->data = this;
    {
      std::lock_guard<std::mutex> lock(mutex);
      loop = &eventLoop;
      loopThreadId = std::this_thread::get_id();
      wake = async.get();
      running = true;
    }
    started.notify_all();
    stop.promise.wait(eventLoop.waitScope());

    {
      std::lock_guard<std::mutex> lock(mutex);
      running = false;
      stopped = true;
      wake = nullptr;
    }
    async.close();
    // Work still in flight goes first (its waiters learn the loop stopped), then what was
    // posted and never ran.
    state.tasks = nullptr;
    // What Python still holds, newest first: pools go before their groups and resolvers.
    while (!state.held.empty()) state.held.erase(std::prev(state.held.end()));
    std::vector<kj::Function<void(EventLoop&)>> left;
    {
      std::lock_guard<std::mutex> lock(mutex);
      left = kj::mv(posted);
    }
    left.clear();
    loopState = nullptr;
    loop = nullptr;
    eventLoop.waitScope().poll();
  });
  KJ_IF_MAYBE(e, failure) {
    fprintf(stderr, "troupe: the Python module's event loop failed: %s\n",
            e->getDescription().cStr());
    std::lock_guard<std::mutex> lock(mutex);
    running = false;
    stopped = true;
    started.notify_all();
  }
}

void Runtime::runPosted() {
  std::vector<kj::Function<void(EventLoop&)>> batch;
  {
    std::lock_guard<std::mutex> lock(mutex);
    batch.swap(posted);
  }
  for (auto& fn : batch) {
    KJ_IF_MAYBE(e, kj::runCatchingExceptions([&]() { fn(*loop); })) {
      loop->logger()->error("python: {}", e->getDescription().cStr());
    }
  }
}

bool Runtime::post(kj::Function<void(EventLoop&)> fn) {
  std::lock_guard<std::mutex> lock(mutex);
  if (!running) {
    // Never run, never dropped (see above).
    new kj::Function<void(EventLoop&)>(kj::mv(fn));
    return false;
  }
  bool first = posted.empty();
  posted.push_back(kj::mv(fn));
  if (first) uv_async_send(static_cast<uv_async_t*>(wake));
  return true;
}

bool Runtime::onLoopThread() const { return std::this_thread::get_id() == loopThreadId; }

void Runtime::beforeFork() { get().mutex.lock(); }

void Runtime::afterForkInParent() { get().mutex.unlock(); }

void Runtime::afterForkInChild() {
  auto& self = get();
  self.running = false;
  self.stopped = true;
  self.forked = true;
  self.wake = nullptr;
  self.loop = nullptr;
  self.mutex.unlock();
}

const char* Runtime::stoppedReason() const {
  if (forked) {
    return "troupe cannot be used in a child made by fork() after it started in the parent "
           "(use multiprocessing's 'spawn' or 'forkserver' start method, or start troupe in "
           "the child only)";
  }
  return "troupe's event loop has stopped";
}

void Runtime::shutdown() {
  if (onLoopThread()) return;
  {
    std::lock_guard<std::mutex> lock(mutex);
    // The loop thread is the parent's: there is nothing to stop or join.
    if (forked) return;
  }
  bool wasRunning;
  {
    std::lock_guard<std::mutex> lock(mutex);
    wasRunning = running;
  }
  // Once it stopped (or never started), the loop thread has ended or is ending by itself.
  if (wasRunning) post([](EventLoop&) { KJ_ASSERT_NONNULL(loopState).stop->fulfill(); });
  py::gil_scoped_release released;
  if (thread.joinable()) thread.join();
}

namespace {

// A Completion whose work has not started: failed if dropped so (the loop stopped with the work
// still posted), so that its waiter does not wait for ever.
struct Unstarted {
  explicit Unstarted(Completion& c) : completion(kj::atomicAddRef(c)) {}
  Unstarted(Unstarted&&) = default;
  ~Unstarted() noexcept(false) {
    if (completion.get() != nullptr) {
      completion->fail(makeError(ErrorCode::FAILED, Runtime::get().stoppedReason()));
    }
  }
  kj::Own<Completion> take() { return kj::mv(completion); }
  kj::Own<Completion> completion;
};

}  // namespace

void start(Completion& completion, kj::Function<kj::Promise<void>(EventLoop&, Completion&)> fn) {
  auto posted = Runtime::get().post(
      [unstarted = Unstarted(completion), fn = kj::mv(fn)](EventLoop& loop) mutable {
        auto c = unstarted.take();
        auto& mine = *c;
        mine.track(kj::evalNow([&]() { return fn(loop, mine); }));
      });
  if (!posted) completion.fail(makeError(ErrorCode::FAILED, Runtime::get().stoppedReason()));
}

}  // namespace troupe::python
