// troupe wait PREFIX --count N [--timeout DURATION]: blocks until N endpoints under PREFIX are
// READY.

#include <signal.h>
#include <stdio.h>

#include <algorithm>
#include <set>
#include <string>

#include <kj/debug.h>

#include "troupe/actor/endpoint.h"
#include "troupe/base/errors.h"
#include "troupe/base/event_loop.h"
#include "troupe/resolver/open_resolver.h"
#include "tools/troupe/cli.h"
#include "tools/troupe/commands.h"

namespace troupe::cli {

namespace {

// "job 'calc' ended: stopped".
kj::Exception jobEnded(const JobStatus& job) {
  return makeError(ErrorCode::JOB_ENDED,
                   kj::str("job '", job.jobId.c_str(), "' ended", job.reason.empty() ? "" : ": ",
                           job.reason.c_str()));
}

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
          kj::throwFatalException(jobEnded(event.job));
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

// The job whose endpoints `prefix` names: the part before the first '/' ("calc/" and
// "calc/calc-0" name job calc), or the whole prefix when it has no '/' and is a job id. Null when
// the prefix names no one job.
kj::Maybe<std::string> jobNamedBy(const std::string& prefix) {
  auto slash = prefix.find('/');
  std::string jobId = slash == std::string::npos ? prefix : prefix.substr(0, slash);
  bool valid = kj::runCatchingExceptions([&]() { validateJobId(jobId.c_str()); }) == nullptr;
  if (!valid) return nullptr;
  return jobId;
}

// Rejects with JOB_ENDED when the job `prefix` names has already ended; otherwise never resolves.
// A watch reports only the ends it sees happen, so an end before the wait began is asked for.
kj::Promise<void> failIfEnded(Resolver& resolver, const std::string& prefix) {
  KJ_IF_MAYBE(jobId, jobNamedBy(prefix)) {
    return resolver.jobStatus(jobId->c_str())
        .then([jobId = *jobId](JobStatus status) -> kj::Promise<void> {
          if (status.state != JobState::ENDED) return kj::NEVER_DONE;
          status.jobId = jobId;
          return jobEnded(status);
        });
  }
  return kj::NEVER_DONE;
}

class WaitCommand final : public Command {
public:
  kj::MainFunc parser(kj::ProcessContext& context) override {
    return credentialFlags
        .addTo(
            kj::MainBuilder(
                context, VERSION_TEXT,
                "Waits until --count N endpoints whose names start with PREFIX are READY, then "
                "prints their names. Exits 1 when the timeout passes first, or when the job under "
                "PREFIX ends or has ended.")
                .addOptionWithArg(
                    {"count"},
                    [this](kj::StringPtr text) {
                      count = parseWhole("--count", text, 1);
                      return true;
                    },
                    "N", "How many endpoints must be READY (needed).")
                .addOptionWithArg(
                    {"timeout"},
                    [this](kj::StringPtr text) {
                      timeout = parseDuration("--timeout", text);
                      return true;
                    },
                    "DURATION", "How long to wait (default 60s).")
                .addOptionWithArg({"resolver"}, storeIn(resolver), "URL",
                                  "Default: $TROUPE_RESOLVER.")
                .expectArg("PREFIX", storeIn(prefix)))
        .build();
  }

  int run() override {
    if (count == 0) throw UsageError{"--count N is needed"};
    CommandLoop command(credentialFlags);
    auto& loop = command.loop;
    auto& opened = command.resolver(resolver);
    // The watch first: a job that ends after it started is reported by the watch itself.
    auto watch = opened.watch(prefix.c_str());
    ReadyTracker tracker(*watch, count);
    auto ended = failIfEnded(opened, prefix);
    auto expired = loop.timer().afterDelay(timeout).then([&]() -> kj::Promise<void> {
      return makeError(ErrorCode::DEADLINE_EXCEEDED,
                       kj::str(tracker.ready.size(), " of ", count, " endpoints under '",
                               prefix.c_str(), "' ready after ", durationText(timeout)));
    });
    auto interrupted = loop.onSignal({SIGINT, SIGTERM}).then([](int) -> kj::Promise<void> {
      return KJ_EXCEPTION(FAILED, "interrupted");
    });
    auto failure = kj::runCatchingExceptions([&]() {
      tracker.run()
          .exclusiveJoin(kj::mv(ended))
          .exclusiveJoin(kj::mv(expired))
          .exclusiveJoin(kj::mv(interrupted))
          .wait(loop.waitScope());
    });
    if (stdoutIsTerminal()) printf("\n");  // ends the progress line
    KJ_IF_MAYBE(e, failure) {
      kj::throwFatalException(kj::mv(*e));
    }
    for (auto& name : tracker.ready) printf("%s\n", name.c_str());
    return 0;
  }

private:
  uint64_t count = 0;
  kj::Duration timeout = 60 * kj::SECONDS;
  std::string resolver;
  CredentialFlags credentialFlags;
  std::string prefix;
};

}  // namespace

kj::Own<Command> waitCommand() { return kj::heap<WaitCommand>(); }

}  // namespace troupe::cli
