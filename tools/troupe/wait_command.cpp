// troupe wait PREFIX --count N [--timeout S]: blocks until N endpoints under PREFIX are READY.

#include <signal.h>
#include <stdio.h>

#include <set>
#include <string>

#include "troupe/actor/errors.h"
#include "troupe/actor/event_loop.h"
#include "troupe/resolver/open_resolver.h"
#include "tools/troupe/cli.h"
#include "tools/troupe/commands.h"

namespace troupe::cli {

namespace {

constexpr const char* USAGE =
    "usage: troupe wait PREFIX --count N [--timeout SECONDS] [--resolver URL]\n"
    "Waits until N endpoints whose names start with PREFIX are READY, then prints their names.\n"
    "Exits 1 when the timeout (default 60) passes first, or when a job under PREFIX ends.\n"
    "  --resolver URL   default: $TROUPE_RESOLVER\n";

// The READY endpoints under a watch's prefix, as its events arrive.
class ReadyTracker {
public:
  ReadyTracker(Watch& watch, size_t count) : watch(watch), count(count) {}

  kj::Promise<void> run() {
    return watch.next().then([this](WatchEvent event) -> kj::Promise<void> {
      auto& e = event.endpoint;
      switch (event.type) {
        case WatchEvent::Type::ADDED:
        case WatchEvent::Type::CHANGED:
          if (e.state == EndpointState::READY) {
            ready.insert(e.name);
          } else {
            ready.erase(e.name);
          }
          break;
        case WatchEvent::Type::REMOVED:
          ready.erase(e.name);
          break;
        case WatchEvent::Type::SYNCED:
          synced = true;
          break;
        case WatchEvent::Type::JOB_ENDED:
          throwError(ErrorCode::JOB_ENDED, kj::str("job '", event.job.jobId.c_str(),
                                                   "' ended: ", event.job.reason.c_str()));
      }
      if (synced) progress();
      if (synced && ready.size() >= count) return kj::READY_NOW;
      return run();
    });
  }

  std::set<std::string> ready;

private:
  void progress() {
    if (!stdoutIsTerminal() || ready.size() == shown) return;
    shown = ready.size();
    printf("\r%zu/%zu ready", std::min(shown, count), count);
    fflush(stdout);
  }

  Watch& watch;
  size_t count;
  bool synced = false;
  size_t shown = SIZE_MAX;
};

}  // namespace

int waitCommand(int argc, char** argv) {
  return runCommand("wait", USAGE, [&]() {
    Args args(argc, argv, {}, {"--count", "--timeout", "--resolver"});
    if (args.has("--help")) {
      fputs(USAGE, stdout);
      return 0;
    }
    if (args.positional.size() != 1) throw UsageError{"one PREFIX is needed"};
    if (!args.has("--count")) throw UsageError{"--count N is needed"};
    auto count = args.number("--count", 1, 1);
    double timeout = args.decimal("--timeout", 60);
    auto url = resolverUrl(args);
    std::string prefix = args.positional[0];

    EventLoop loop;
    auto resolver = openResolver(loop, url.c_str());
    auto watch = resolver->watch(prefix.c_str());
    ReadyTracker tracker(*watch, count);
    auto limit = static_cast<int64_t>(timeout * 1000) * kj::MILLISECONDS;
    auto expired = loop.timer().afterDelay(limit).then([&]() -> kj::Promise<void> {
      return makeError(ErrorCode::DEADLINE_EXCEEDED,
                       kj::str(tracker.ready.size(), " of ", count, " endpoints under '",
                               prefix.c_str(), "' ready after ", timeout, " s"));
    });
    auto interrupted = loop.onSignal({SIGINT, SIGTERM}).then([](int) -> kj::Promise<void> {
      return KJ_EXCEPTION(FAILED, "interrupted");
    });
    auto failure = kj::runCatchingExceptions([&]() {
      tracker.run().exclusiveJoin(kj::mv(expired)).exclusiveJoin(kj::mv(interrupted))
          .wait(loop.waitScope());
    });
    if (stdoutIsTerminal()) printf("\n");  // ends the progress line
    KJ_IF_MAYBE(e, failure) {
      kj::throwFatalException(kj::mv(*e));
    }
    for (auto& name : tracker.ready) printf("%s\n", name.c_str());
    return 0;
  });
}

}  // namespace troupe::cli
