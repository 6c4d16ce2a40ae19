#include "tests/support/test_actors.h"

#include <unistd.h>

#include <cmath>
#include <cstdint>

#include <kj/debug.h>

namespace troupe::test {

// A caller picks the operands: one whose result does not fit an Int64 gets an error, as one who
// divides by zero does, rather than undefined behaviour in the server (INT64_MIN / -1 traps).
kj::Promise<void> CalculatorImpl::add(AddContext context) {
  auto p = context.getParams();
  int64_t sum;
  KJ_REQUIRE(!__builtin_add_overflow(p.getA(), p.getB(), &sum), "the sum overflows an Int64",
             p.getA(), p.getB());
  context.getResults().setSum(sum);
  return kj::READY_NOW;
}

kj::Promise<void> CalculatorImpl::divide(DivideContext context) {
  auto p = context.getParams();
  KJ_REQUIRE(p.getB() != 0, "division by zero", p.getA());
  KJ_REQUIRE(p.getA() != INT64_MIN || p.getB() != -1, "the quotient overflows an Int64", p.getA());
  context.getResults().setQuotient(p.getA() / p.getB());
  return kj::READY_NOW;
}

kj::Promise<void> CalculatorImpl::sqrt(SqrtContext context) {
  context.getResults().setRoot(std::sqrt(context.getParams().getX()));
  return kj::READY_NOW;
}

kj::Promise<void> EchoImpl::echo(EchoContext context) {
  auto in = context.getParams().getPayload();
  context.getResults(capnp::MessageSize{in.size() / sizeof(capnp::word) + 8, 0}).setPayload(in);
  return kj::READY_NOW;
}

kj::Promise<void> EchoImpl::whoami(WhoamiContext context) {
  auto r = context.getResults();
  r.setPid(static_cast<uint32_t>(getpid()));
  r.setIncarnation(incarnation);
  return kj::READY_NOW;
}

kj::Promise<void> MemberImpl::whoami(WhoamiContext context) {
  ++count;
  context.getResults().setName(name.c_str());
  return kj::READY_NOW;
}

kj::Promise<void> MemberImpl::raise(RaiseContext context) {
  ++count;
  KJ_FAIL_REQUIRE("raised on request", context.getParams().getMessage());
}

kj::Promise<void> MemberImpl::throw_(ThrowContext context) {
  ++count;
  auto p = context.getParams();
  return kj::Exception(static_cast<kj::Exception::Type>(p.getType()), __FILE__, __LINE__,
                       kj::str(p.getDescription()));
}

kj::Promise<void> MemberImpl::self(SelfContext context) {
  // Answers at the next call of calls(), so that a call pipelined on the result can arrive first.
  auto paf = kj::newPromiseAndFulfiller<void>();
  selves.add(kj::mv(paf.fulfiller));
  return paf.promise.then([this, context]() mutable { context.getResults().setMember(thisCap()); });
}

kj::Promise<void> MemberImpl::calls(CallsContext context) {
  for (auto& f : selves) f->fulfill();
  selves.clear();
  context.getResults().setCount(count);
  return kj::READY_NOW;
}

// ------------------------------------------------------------------------------------------------

kj::Promise<void> BlockerState::whenStarted(uint32_t count) {
  if (started >= count) return kj::READY_NOW;
  auto paf = kj::newPromiseAndFulfiller<void>();
  waiters.add(Waiter{&started, count, kj::mv(paf.fulfiller)});
  return kj::mv(paf.promise);
}

kj::Promise<void> BlockerState::whenCancelled(uint32_t count) {
  if (cancelled >= count) return kj::READY_NOW;
  auto paf = kj::newPromiseAndFulfiller<void>();
  waiters.add(Waiter{&cancelled, count, kj::mv(paf.fulfiller)});
  return kj::mv(paf.promise);
}

bool BlockerState::release(const std::string& tag) {
  auto it = held.find(tag);
  if (it == held.end()) return false;
  auto fulfiller = kj::mv(it->second);
  held.erase(it);
  fulfiller->fulfill();
  return true;
}

void BlockerState::changed() {
  kj::Vector<Waiter> keep;
  for (auto& w : waiters) {
    if (*w.counter >= w.target) {
      w.fulfiller->fulfill();
    } else {
      keep.add(kj::mv(w));
    }
  }
  waiters = kj::mv(keep);
}

namespace {

// Counts a hold as finished or cancelled, whichever happens to it.
class HoldTracker {
public:
  HoldTracker(BlockerState& state, std::string tag) : state(state), tag(kj::mv(tag)) {
    state.started++;
    state.running++;
    if (state.running > state.maxConcurrent) state.maxConcurrent = state.running;
    state.changed();
  }
  ~HoldTracker() noexcept(false) {
    state.running--;
    if (done) {
      state.finished++;
    } else {
      state.cancelled++;
      state.held.erase(tag);
    }
    state.changed();
  }
  bool done = false;

private:
  BlockerState& state;
  std::string tag;
};

}  // namespace

kj::Promise<void> BlockerImpl::hold(HoldContext context) {
  std::string tag = context.getParams().getTag().cStr();
  uint64_t replyBytes = context.getParams().getReplyBytes();
  auto paf = kj::newPromiseAndFulfiller<void>();
  state.held[tag] = kj::mv(paf.fulfiller);
  auto tracker = kj::heap<HoldTracker>(state, tag);
  auto& t = *tracker;
  return paf.promise
      .then([context, tag, replyBytes, &t]() mutable {
        t.done = true;
        auto results = context.getResults();
        results.setTag(tag.c_str());
        if (replyBytes > 0) {
          auto payload = results.initPayload(replyBytes);
          for (uint64_t i = 0; i < replyBytes; ++i) payload[i] = static_cast<kj::byte>(i % 251);
        }
      })
      .attach(kj::mv(tracker));
}

kj::Promise<void> BlockerImpl::release(ReleaseContext context) {
  context.getResults().setReleased(state.release(context.getParams().getTag().cStr()));
  return kj::READY_NOW;
}

kj::Promise<void> BlockerImpl::waitStarted(WaitStartedContext context) {
  return state.whenStarted(context.getParams().getCount());
}

kj::Promise<void> BlockerImpl::waitCancelled(WaitCancelledContext context) {
  return state.whenCancelled(context.getParams().getCount());
}

kj::Promise<void> BlockerImpl::stats(StatsContext context) {
  auto r = context.getResults();
  r.setStarted(state.started);
  r.setFinished(state.finished);
  r.setCancelled(state.cancelled);
  r.setMaxConcurrent(state.maxConcurrent);
  return kj::READY_NOW;
}

kj::Promise<capnp::Response<Blocker::HoldResults>> holdStarted(ActorRef<Blocker>& blocker,
                                                               kj::StringPtr tag,
                                                               uint32_t startedCount,
                                                               kj::WaitScope& ws) {
  auto held = blocker.call([tag](Blocker::Client c) {
    auto q = c.holdRequest();
    q.setTag(tag);
    return q.send();
  });
  blocker
      .call([startedCount](Blocker::Client c) {
        auto q = c.waitStartedRequest();
        q.setCount(startedCount);
        return q.send();
      })
      .wait(ws);
  return held;
}

}  // namespace troupe::test
