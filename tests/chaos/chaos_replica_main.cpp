// A replica of the chaos test's job (chaos_test.cpp): hosts the Chaos actor "chaos" with
// hostActor(), its job, task and resolver from the environment the launcher set, until SIGTERM.
//
// Its environment also holds:
//   TROUPE_CHAOS_LEDGER_DIR   where this incarnation's ledger file goes (ledger.h); required
//   TROUPE_CHAOS_PARENT_PID   the test's pid: the replica dies with it (PR_SET_PDEATHSIG), so
//                             that a test that crashed leaves no replica behind

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <kj/debug.h>
#include <spdlog/spdlog.h>

#include "troupe/base/parse_number.h"
#include "troupe/resolver/host_actor.h"
#include "chaos.capnp.h"
#include "tests/chaos/ledger.h"

namespace troupe::chaos {
namespace {

// Each call takes (callId % SERVICE_SPREAD) ms before it answers, recordOnce() after it wrote
// its ledger line: a kill or a freeze then often lands between a call's running and its answer,
// the moment when "may have run" is the truth.
constexpr uint64_t SERVICE_SPREAD = 16;

class ChaosImpl final : public Chaos::Server {
public:
  ChaosImpl(EventLoop& loop, LedgerWriter ledger) : loop(loop), ledger(kj::mv(ledger)) {}

protected:
  kj::Promise<void> idempotentOp(IdempotentOpContext context) override {
    return serviceTime(context.getParams().getCallId()).then([context]() mutable {
      context.getResults().setPid(static_cast<uint32_t>(getpid()));
    });
  }

  kj::Promise<void> recordOnce(RecordOnceContext context) override {
    auto callId = context.getParams().getCallId();
    ledger.record(callId);
    return serviceTime(callId).then(
        [context]() mutable { context.getResults().setPid(static_cast<uint32_t>(getpid())); });
  }

private:
  kj::Promise<void> serviceTime(uint64_t callId) {
    return loop.timer().afterDelay((callId % SERVICE_SPREAD) * kj::MILLISECONDS);
  }

  EventLoop& loop;
  LedgerWriter ledger;
};

// Asks for SIGKILL when the test process dies; false when it is gone already.
bool followParent() {
  const char* value = getenv("TROUPE_CHAOS_PARENT_PID");
  if (value == nullptr) return true;
  auto pid = parseWholeNumber(kj::StringPtr(value), INT32_MAX).orDefault(0);
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  return pid == 0 || getppid() == static_cast<pid_t>(pid);
}

}  // namespace
}  // namespace troupe::chaos

int main() {
  if (!troupe::chaos::followParent()) return 1;
  const char* dir = getenv(troupe::chaos::LEDGER_DIR_VARIABLE);
  if (dir == nullptr) {
    fprintf(stderr, "chaos replica: %s is not set\n", troupe::chaos::LEDGER_DIR_VARIABLE);
    return 2;
  }
  troupe::EventLoop loop({.logger = spdlog::default_logger()});
  int status = 1;
  KJ_IF_MAYBE(e, kj::runCatchingExceptions([&]() {
                auto job = troupe::JobContext::fromEnvironment();
                troupe::chaos::LedgerWriter ledger(dir, job.taskIndex);
                // A short drain: at the end the test has stopped its calls, and a replica still
                // draining when the launcher's grace runs out would be SIGKILLed, which the test
                // counts as a crash.
                troupe::HostOptions options{.server = {.drainGracePeriod = 2 * kj::SECONDS}};
                status = troupe::hostActor<troupe::chaos::Chaos>(
                    loop, "chaos", kj::heap<troupe::chaos::ChaosImpl>(loop, kj::mv(ledger)),
                    kj::mv(options));
              })) {
    fprintf(stderr, "chaos replica: %s\n", e->getDescription().cStr());
  }
  return status;
}
