#include "troupe/base/event_loop.h"

#include <signal.h>

#include <typeindex>
#include <utility>

#include <kj/vector.h>
#include <spdlog/spdlog.h>

#include "troupe/base/buffer_cache.h"
#include "troupe/base/detail/uv_event_port.h"
#include "troupe/base/detail/uv_io.h"
#include "troupe/base/logging.h"

namespace troupe {

namespace {

// A write to a socket whose peer has gone must fail with EPIPE, not kill the process. troupe's
// own sockets use MSG_NOSIGNAL; this covers pipes and kj's helper threads, as kj itself does.
void ignoreSigpipe() {
  struct sigaction current;
  if (sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL) {
    signal(SIGPIPE, SIG_IGN);
  }
}

// The clock of a loop made with EventLoopOptions::manualClock: kj's TimerImpl, moved only by
// advance(). It starts at the system clocks' current readings, so its times look like a real
// loop's that then stood still.
class ManualTimer final : public kj::Timer {
public:
  ManualTimer()
      : impl(kj::systemPreciseMonotonicClock().now()),
        startedAt(impl.now()),
        calendarAtStart(kj::systemPreciseCalendarClock().now()) {}

  kj::TimePoint now() const override { return impl.now(); }

  kj::Promise<void> atTime(kj::TimePoint time) override {
    // TimerImpl fires only in advanceTo(); nothing else would wake a timer already due.
    if (time <= impl.now()) return kj::READY_NOW;
    return impl.atTime(time);
  }

  kj::Promise<void> afterDelay(kj::Duration delay) override { return atTime(impl.now() + delay); }

  void advance(kj::Duration delay) {
    KJ_REQUIRE(delay >= 0 * kj::NANOSECONDS, "time cannot go backwards", delay);
    impl.advanceTo(impl.now() + delay);
  }

  kj::Date calendarNow() const { return calendarAtStart + (impl.now() - startedAt); }

private:
  kj::TimerImpl impl;
  kj::TimePoint startedAt;
  kj::Date calendarAtStart;
};

// Calls trimMessageBuffers() once per BUFFER_CACHE_TRIM_INTERVAL of `timer`, counting
// the intervals since `last` (more than one when the loop was busy or a manual clock took a long
// step), so the cache's idle bound holds in loop time.
kj::Promise<void> trimMessageBuffersEvery(kj::Timer& timer, kj::TimePoint last) {
  constexpr auto& INTERVAL = BUFFER_CACHE_TRIM_INTERVAL;
  return timer.atTime(last + INTERVAL).then([&timer, last]() {
    int64_t intervals = kj::max(int64_t{1}, (timer.now() - last) / INTERVAL);
    trimMessageBuffers(static_cast<uint64_t>(intervals));
    return trimMessageBuffersEvery(timer, last + intervals * INTERVAL);
  });
}

// While it lives, this thread's message buffer cache is trimmed by a loop (buffer_cache.h).
class TrimmedHere {
public:
  TrimmedHere() { beginTrimmingMessageBuffers(); }
  ~TrimmedHere() { endTrimmingMessageBuffers(); }
  KJ_DISALLOW_COPY(TrimmedHere);
};

}  // namespace

struct EventLoop::Impl {
  explicit Impl(EventLoopOptions&& options)
      : log(options.logger ? kj::mv(options.logger) : newLogger()),
        random(options.randomSeed.orDefault(std::random_device()())) {
    checkUv("uv_loop_init", uv_loop_init(&uv));
    port = kj::heap<base_detail::UvEventPort>(&uv);
    kjLoop = kj::heap<kj::EventLoop>(*port);
    scope = kj::heap<kj::WaitScope>(*kjLoop);
    if (options.manualClock) {
      manual = kj::heap<ManualTimer>();
      clock = manual.get();
    } else {
      clock = &port->timer();
    }
    lowLevel = kj::heap<base_detail::UvLowLevelIo>(&uv, *clock);
    provider = kj::newAsyncIoProvider(*lowLevel);

    // Gives back the large message buffers this thread has stopped reusing, on this loop's
    // clock (buffer_cache.h). Cancelled first when the loop goes.
    trim = trimMessageBuffersEvery(*clock, clock->now()).eagerlyEvaluate([this](kj::Exception&& e) {
      log->error("the buffer cache's trim stopped: {}", e.getDescription().cStr());
    });
  }

  TrimmedHere trimmed;  // first made, last gone
  std::shared_ptr<spdlog::logger> log;
  Random random;
  uv_loop_t uv;
  kj::Own<base_detail::UvEventPort> port;
  kj::Own<kj::EventLoop> kjLoop;
  kj::Own<kj::WaitScope> scope;
  kj::Own<ManualTimer> manual;  // null unless the loop keeps time by hand
  kj::Timer* clock = nullptr;   // what timer() returns: `manual`, or the port's own timer
  kj::Own<base_detail::UvLowLevelIo> lowLevel;
  kj::Own<kj::AsyncIoProvider> provider;
  kj::Promise<void> trim = nullptr;
  MetricsSet metrics;
  // Higher layers' per-loop objects, in the order made (EventLoop::service()).
  kj::Vector<std::pair<std::type_index, kj::Own<Service>>> services;
};

EventLoop::EventLoop(EventLoopOptions options) {
  ignoreSigpipe();
  impl = kj::heap<Impl>(kj::mv(options));
}

EventLoop::~EventLoop() noexcept(false) {
  kj::UnwindDetector unwind;
  // Services first, the last made first: they may hold kj objects of this loop.
  while (!impl->services.empty()) {
    auto last = kj::mv(impl->services.back().second);
    impl->services.removeLast();
  }
  // kj next: its objects close their libuv handles as they go.
  impl->trim = nullptr;
  impl->scope->cancelAllDetached();
  impl->provider = nullptr;
  impl->lowLevel = nullptr;
  impl->scope = nullptr;
  impl->kjLoop = nullptr;
  impl->clock = nullptr;
  impl->manual = nullptr;
  impl->port = nullptr;

  // Whatever is still open now was leaked by an object that outlived the loop.
  kj::Vector<kj::String> leaked;
  uv_walk(
      &impl->uv,
      [](uv_handle_t* handle, void* arg) {
        if (uv_is_closing(handle)) return;
        static_cast<kj::Vector<kj::String>*>(arg)->add(
            kj::str(uv_handle_type_name(uv_handle_get_type(handle))));
        handle->data = nullptr;
        uv_close(handle, nullptr);
      },
      &leaked);
  // Runs close callbacks and waits for thread-pool work that was abandoned mid-flight.
  uv_run(&impl->uv, UV_RUN_DEFAULT);
  int closed = uv_loop_close(&impl->uv);
  impl = nullptr;

  if (!unwind.isUnwinding()) {
    KJ_REQUIRE(leaked.empty() && closed == 0,
               "libuv handles outlived their EventLoop (destroy them before the loop)",
               kj::strArray(leaked, ", "), closed);
  }
}

kj::WaitScope& EventLoop::waitScope() { return *impl->scope; }
kj::AsyncIoProvider& EventLoop::io() { return *impl->provider; }
kj::LowLevelAsyncIoProvider& EventLoop::lowLevelIo() { return *impl->lowLevel; }
kj::Network& EventLoop::network() { return impl->provider->getNetwork(); }
kj::Timer& EventLoop::timer() { return *impl->clock; }
const kj::Executor& EventLoop::executor() { return impl->kjLoop->getExecutor(); }
uv_loop_t* EventLoop::uvLoop() { return &impl->uv; }
const std::shared_ptr<spdlog::logger>& EventLoop::logger() const { return impl->log; }
MetricsSet& EventLoop::metrics() { return impl->metrics; }
Random& EventLoop::random() { return impl->random; }

kj::Maybe<EventLoop::Service&> EventLoop::findService(const std::type_info& type) {
  for (auto& entry : impl->services) {
    if (entry.first == std::type_index(type)) return *entry.second;
  }
  return nullptr;
}

EventLoop::Service& EventLoop::addService(const std::type_info& type, kj::Own<Service> service) {
  auto& added = *service;
  impl->services.add(std::type_index(type), kj::mv(service));
  return added;
}

kj::Date EventLoop::calendarNow() const {
  if (impl->manual.get() != nullptr) return impl->manual->calendarNow();
  return kj::systemPreciseCalendarClock().now();
}

void EventLoop::advanceTime(kj::Duration delay) {
  KJ_REQUIRE(impl->manual.get() != nullptr,
             "advanceTime() needs a loop made with EventLoopOptions::manualClock");
  impl->manual->advance(delay);
}

bool EventLoop::hasManualClock() const { return impl->manual.get() != nullptr; }

// ------------------------------------------------------------------------------------------------
// offload

namespace {

class OffloadAdapter;

// Owned by libuv from uv_queue_work() until the after-work callback, which either hands the
// task back to the waiting promise or, if that promise was dropped, frees it.
struct OffloadRequest {
  uv_work_t req;
  kj::Own<base_detail::OffloadTask> task;
  OffloadAdapter* adapter;  // null once the promise was dropped
};

class OffloadAdapter {
public:
  OffloadAdapter(kj::PromiseFulfiller<kj::Own<base_detail::OffloadTask>>& fulfiller,
                 uv_loop_t* loop, kj::Own<base_detail::OffloadTask> task)
      : fulfiller(fulfiller), request(new OffloadRequest{{}, kj::mv(task), this}) {
    request->req.data = request;
    int status = uv_queue_work(loop, &request->req, &OffloadAdapter::work, &OffloadAdapter::done);
    if (status < 0) {
      delete request;
      request = nullptr;
      fulfiller.reject(KJ_EXCEPTION(FAILED, kj::str("uv_queue_work: ", uv_strerror(status))));
    }
  }

  ~OffloadAdapter() noexcept(false) {
    if (request != nullptr) {
      // Dropped while queued or running: cancel if not started; otherwise let it finish.
      request->adapter = nullptr;
      uv_cancel(reinterpret_cast<uv_req_t*>(&request->req));
    }
  }

private:
  static void work(uv_work_t* req) { static_cast<OffloadRequest*>(req->data)->task->run(); }

  static void done(uv_work_t* req, int) {
    auto* r = static_cast<OffloadRequest*>(req->data);
    if (r->adapter != nullptr) {
      r->adapter->request = nullptr;
      r->adapter->fulfiller.fulfill(kj::mv(r->task));
    }
    delete r;
  }

  kj::PromiseFulfiller<kj::Own<base_detail::OffloadTask>>& fulfiller;
  OffloadRequest* request;
};

}  // namespace

kj::Promise<kj::Own<base_detail::OffloadTask>> EventLoop::offloadTask(
    kj::Own<base_detail::OffloadTask> task) {
  return kj::newAdaptedPromise<kj::Own<base_detail::OffloadTask>, OffloadAdapter>(&impl->uv,
                                                                                  kj::mv(task));
}

// ------------------------------------------------------------------------------------------------
// signals

namespace {

class SignalAdapter {
public:
  SignalAdapter(kj::PromiseFulfiller<int>& fulfiller, uv_loop_t* loop,
                std::initializer_list<int> signals)
      : fulfiller(fulfiller) {
    for (int signum : signals) {
      UvHandle<uv_signal_t> handle;
      checkUv("uv_signal_init", uv_signal_init(loop, handle.get()));
      handle.markInitialised();
      handle->data = this;
      checkUv("uv_signal_start", uv_signal_start(
                                     handle.get(),
                                     [](uv_signal_t* h, int signum) {
                                       auto* self = static_cast<SignalAdapter*>(h->data);
                                       if (self != nullptr) self->fire(signum);
                                     },
                                     signum));
      handles.add(kj::mv(handle));
    }
  }

private:
  void fire(int signum) {
    for (auto& h : handles) uv_signal_stop(h.get());
    fulfiller.fulfill(kj::mv(signum));
  }

  kj::PromiseFulfiller<int>& fulfiller;
  kj::Vector<UvHandle<uv_signal_t>> handles;
};

}  // namespace

kj::Promise<int> EventLoop::onSignal(std::initializer_list<int> signals) {
  return kj::newAdaptedPromise<int, SignalAdapter>(&impl->uv, signals);
}

}  // namespace troupe
