#pragma once
// Actor implementations the tests host, in process and in tests/support/test_server.

#include <map>
#include <string>

#include <kj/async.h>
#include <kj/vector.h>

#include "troupe/actor/actor_ref.h"
#include "test_actors.capnp.h"

namespace troupe::test {

class CalculatorImpl final : public ScientificCalculator::Server {
protected:
  kj::Promise<void> add(AddContext context) override;
  kj::Promise<void> divide(DivideContext context) override;
  kj::Promise<void> sqrt(SqrtContext context) override;
};

class EchoImpl final : public Echo::Server {
public:
  explicit EchoImpl(uint64_t incarnation = 0) : incarnation(incarnation) {}

protected:
  kj::Promise<void> echo(EchoContext context) override;
  kj::Promise<void> whoami(WhoamiContext context) override;

private:
  uint64_t incarnation;
};

class MemberImpl final : public Member::Server {
public:
  explicit MemberImpl(std::string name) : name(kj::mv(name)) {}
  uint64_t count = 0;

protected:
  kj::Promise<void> whoami(WhoamiContext context) override;
  kj::Promise<void> raise(RaiseContext context) override;
  kj::Promise<void> calls(CallsContext context) override;
  kj::Promise<void> throw_(ThrowContext context) override;
  kj::Promise<void> self(SelfContext context) override;

private:
  std::string name;
  kj::Vector<kj::Own<kj::PromiseFulfiller<void>>> selves;  // self() calls waiting for calls()
};

// Shared between a BlockerImpl and an in-process test, which may wait on it directly.
struct BlockerState {
  uint32_t started = 0;
  uint32_t finished = 0;
  uint32_t cancelled = 0;
  uint32_t running = 0;
  uint32_t maxConcurrent = 0;
  std::map<std::string, kj::Own<kj::PromiseFulfiller<void>>> held;

  kj::Promise<void> whenStarted(uint32_t count);
  kj::Promise<void> whenCancelled(uint32_t count);
  bool release(const std::string& tag);

  // Internal: wakes waiters whose condition now holds.
  void changed();
  struct Waiter {
    const uint32_t* counter;
    uint32_t target;
    kj::Own<kj::PromiseFulfiller<void>> fulfiller;
  };
  kj::Vector<Waiter> waiters;
};

class BlockerImpl final : public Blocker::Server {
public:
  explicit BlockerImpl(BlockerState& state) : state(state) {}

protected:
  kj::Promise<void> hold(HoldContext context) override;
  kj::Promise<void> release(ReleaseContext context) override;
  kj::Promise<void> waitStarted(WaitStartedContext context) override;
  kj::Promise<void> waitCancelled(WaitCancelledContext context) override;
  kj::Promise<void> stats(StatsContext context) override;

private:
  BlockerState& state;
};

// Calls blocker.hold(tag) through `blocker` and returns once the server has started it (its
// `startedCount`-th hold), with the promise of the call, which stays in progress until released.
kj::Promise<capnp::Response<Blocker::HoldResults>> holdStarted(ActorRef<Blocker>& blocker,
                                                               kj::StringPtr tag,
                                                               uint32_t startedCount,
                                                               kj::WaitScope& ws);

}  // namespace troupe::test
