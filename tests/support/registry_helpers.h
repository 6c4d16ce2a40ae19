#pragma once
// Helpers shared by the registry tests: bounded waits on promises and watches, a raw Watcher
// capability that records what a registry pushes, a logger that lets a test wait for a log line,
// and the troupe-registry daemon in a child process.

#include <unistd.h>

#include <deque>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <kj/async.h>
#include <kj/debug.h>
#include <kj/vector.h>
#include <spdlog/sinks/base_sink.h>
#include <spdlog/spdlog.h>

#include "troupe/base/errors.h"
#include "troupe/base/event_loop.h"
#include "troupe/resolver/registry_wire.h"
#include "troupe/resolver/resolver.h"
#include "troupe/schemas/registry.capnp.h"
#include "tests/support/child_process.h"
#include "tests/support/manual_clock.h"

namespace troupe::test {

// How long a test waits for something that should happen; reaching it fails the test rather
// than hanging it. Generous: only a broken build ever waits this long. Real time, also on a
// loop with a manual clock.
constexpr kj::Duration PATIENCE = 20 * kj::SECONDS;

// `promise`'s result, failing with "timed out" after `limit` of real time.
template <typename T>
T await(EventLoop& loop, kj::Promise<T>&& promise, kj::Duration limit = PATIENCE) {
  auto expired = afterRealTime(loop, limit).then([]() -> kj::Promise<T> {
    return KJ_EXCEPTION(FAILED, "test timed out waiting for a promise");
  });
  return promise.exclusiveJoin(kj::mv(expired)).wait(loop.waitScope());
}

// What a failed call or operation reported: its troupe error code and description.
struct Failure {
  ErrorCode code = ErrorCode::FAILED;
  std::string text;
  bool mentions(const char* part) const { return text.find(part) != std::string::npos; }
};

inline Failure failureOf(const kj::Exception& e) {
  return Failure{errorCode(e), e.getDescription().cStr()};
}

// What `promise` rejects with; fails the test when it resolves.
template <typename T>
Failure awaitError(EventLoop& loop, kj::Promise<T>&& promise, kj::Duration limit = PATIENCE) {
  auto result = promise.then([](T&&) -> kj::Maybe<Failure> { return nullptr; },
                             [](kj::Exception&& e) -> kj::Maybe<Failure> { return failureOf(e); });
  KJ_IF_MAYBE(f, await(loop, kj::mv(result), limit)) {
    return kj::mv(*f);
  }
  ADD_FAILURE() << "expected the promise to reject";
  return Failure{ErrorCode::FAILED, "(the promise resolved)"};
}

inline Failure awaitError(EventLoop& loop, kj::Promise<void>&& promise,
                          kj::Duration limit = PATIENCE) {
  return awaitError(loop, promise.then([]() { return 0; }), limit);
}

// What `fn` throws; fails the test when it throws nothing.
template <typename Fn>
Failure thrownBy(Fn&& fn) {
  KJ_IF_MAYBE(e, kj::runCatchingExceptions(kj::fwd<Fn>(fn))) {
    return failureOf(*e);
  }
  ADD_FAILURE() << "expected an exception";
  return Failure{ErrorCode::FAILED, "(nothing thrown)"};
}

// "ADDED job-1/ps-0 ready", "SYNCED", "JOB_ENDED job-1 done": one event as a comparable line.
inline std::string describe(const WatchEvent& event) {
  if (event.type == WatchEvent::Type::SYNCED) return "SYNCED";
  if (event.type == WatchEvent::Type::JOB_ENDED) {
    return "JOB_ENDED " + event.job.jobId + " " + event.job.reason;
  }
  return std::string(toString(event.type)) + " " + event.endpoint.name + " " +
         toString(event.endpoint.state).cStr();
}

// The next event of `watch`, waiting at most `limit`.
inline WatchEvent nextEvent(EventLoop& loop, Watch& watch, kj::Duration limit = PATIENCE) {
  return await(loop, watch.next(), limit);
}

inline std::string next(EventLoop& loop, Watch& watch, kj::Duration limit = PATIENCE) {
  return describe(nextEvent(loop, watch, limit));
}

// Whether `watch` has an event ready without waiting for I/O or timers: runs the loop's queue
// (and ready I/O) and reports what arrived, or "(none)".
inline std::string pending(EventLoop& loop, Watch& watch) {
  auto promise = watch.next();
  for (int i = 0; i < 20; ++i) {
    if (promise.poll(loop.waitScope())) return describe(promise.wait(loop.waitScope()));
  }
  return "(none)";
}

inline Endpoint endpoint(std::string name, std::string address = "tcp://127.0.0.1:4000",
                         uint64_t incarnation = 1, EndpointState state = EndpointState::READY) {
  Endpoint e;
  e.name = kj::mv(name);
  e.address = kj::mv(address);
  e.incarnation = incarnation;
  e.state = state;
  return e;
}

// A unix socket path unique to this process and `name`.
inline std::string socketPath(const char* name) {
  return "/tmp/troupe-registry-test-" + std::to_string(getpid()) + "-" + name + ".sock";
}

// A unix socket path for this test, removed (with whatever a killed daemon left there) when this
// goes.
struct TempSocket {
  explicit TempSocket(const char* name) : path(socketPath(name)) { ::unlink(path.c_str()); }
  ~TempSocket() { ::unlink(path.c_str()); }
  TempSocket(const TempSocket&) = delete;
  TempSocket& operator=(const TempSocket&) = delete;
  std::string path;
};

// A raw Watcher capability: records each batch the registry pushes. With `hold` set, events()
// calls stay pending until release() (so a test can make the registry batch).
class RecordingWatcher final : public schema::Watcher::Server {
public:
  struct State {
    std::deque<std::string> events;
    std::vector<size_t> batchSizes;
    bool hold = false;
    kj::Vector<kj::Own<kj::PromiseFulfiller<void>>> held;
    kj::Maybe<kj::Own<kj::PromiseFulfiller<void>>> waiter;
    bool released = false;  // the registry released the capability
    bool failNext = false;  // the next events() call throws

    void release() {
      hold = false;
      for (auto& f : held) f->fulfill();
      held.clear();
    }
  };

  explicit RecordingWatcher(State& state) : state(state) {}
  ~RecordingWatcher() noexcept(false) {
    state.released = true;
    wake();
  }

protected:
  kj::Promise<void> events(EventsContext context) override {
    if (state.failNext) {
      state.failNext = false;
      return KJ_EXCEPTION(FAILED, "watcher refuses events");
    }
    auto list = context.getParams().getEvents();
    state.batchSizes.push_back(list.size());
    for (auto e : list) {
      KJ_IF_MAYBE(event, fromCapnp(e)) {
        state.events.push_back(describe(*event));
      }
    }
    wake();
    if (!state.hold) return kj::READY_NOW;
    auto paf = kj::newPromiseAndFulfiller<void>();
    state.held.add(kj::mv(paf.fulfiller));
    return kj::mv(paf.promise);
  }

private:
  void wake() {
    KJ_IF_MAYBE(w, state.waiter) {
      (*w)->fulfill();
      state.waiter = nullptr;
    }
  }

  State& state;
};

// Waits until `state` holds an event (or the watcher was released) and returns the first, or
// "(released)".
inline std::string nextRecorded(EventLoop& loop, RecordingWatcher::State& state,
                                kj::Duration limit = PATIENCE) {
  while (state.events.empty()) {
    if (state.released) return "(released)";
    auto paf = kj::newPromiseAndFulfiller<void>();
    state.waiter = kj::mv(paf.fulfiller);
    await(loop, kj::mv(paf.promise), limit);
  }
  auto e = state.events.front();
  state.events.pop_front();
  return e;
}

// An spdlog sink that lets the test wait for a line containing some text. Lines are logged on
// the loop thread, so the promise is fulfilled there.
class LineSink final : public spdlog::sinks::base_sink<std::mutex> {
public:
  // Resolves once a line containing `text` is logged (at once if one already was).
  kj::Promise<void> whenLogged(std::string text) {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& l : lines) {
      if (l.find(text) != std::string::npos) return kj::READY_NOW;
    }
    auto paf = kj::newPromiseAndFulfiller<void>();
    waiters.push_back({kj::mv(text), kj::mv(paf.fulfiller)});
    return kj::mv(paf.promise);
  }

  size_t count(const std::string& text) {
    std::lock_guard<std::mutex> lock(mutex_);
    size_t n = 0;
    for (auto& l : lines) n += l.find(text) != std::string::npos;
    return n;
  }

protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    std::string line(msg.payload.data(), msg.payload.size());
    lines.push_back(line);
    for (auto it = waiters.begin(); it != waiters.end();) {
      if (line.find(it->first) != std::string::npos) {
        it->second->fulfill();
        it = waiters.erase(it);
      } else {
        ++it;
      }
    }
  }
  void flush_() override {}

private:
  std::vector<std::string> lines;
  std::vector<std::pair<std::string, kj::Own<kj::PromiseFulfiller<void>>>> waiters;
};

// A logger writing to `sink` (and nowhere else), at every level.
inline std::shared_ptr<spdlog::logger> loggerFor(std::shared_ptr<LineSink> sink) {
  auto logger = std::make_shared<spdlog::logger>("test", sink);
  logger->set_level(spdlog::level::trace);
  return logger;
}

#ifdef TROUPE_REGISTRY_PATH
// The troupe-registry daemon in a child process, listening on `address`; killed and reaped when
// this goes.
struct RegistryProcess {
  explicit RegistryProcess(const std::string& listen, std::vector<std::string> extra = {})
      : process(TROUPE_REGISTRY_PATH, withListen(listen, kj::mv(extra))) {
    std::string line = process.readLine(15000);
    if (line.rfind("LISTENING ", 0) != 0) {
      throw std::runtime_error("troupe-registry did not start; it printed: '" + line + "'");
    }
    address = line.substr(strlen("LISTENING "));
  }

  static std::vector<std::string> withListen(const std::string& listen,
                                             std::vector<std::string> extra) {
    std::vector<std::string> args{"--listen", listen};
    args.insert(args.end(), extra.begin(), extra.end());
    return args;
  }

  ChildProcess process;
  std::string address;
};
#endif

}  // namespace troupe::test
