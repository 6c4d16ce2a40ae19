#include "troupe/actor/detail/actor_gate.h"

#include <kj/debug.h>

#include "troupe/actor/errors.h"

namespace troupe::actor_detail {

CallTracker::~CallTracker() noexcept(false) {
  abortAll(KJ_EXCEPTION(DISCONNECTED, "the actor server was destroyed"));
}

void CallTracker::abortAll(const kj::Exception& reason) {
  while (!calls.empty()) calls.front().abort(reason);
}

void CallTracker::end() {
  KJ_ASSERT(inFlight_ > 0);
  if (--inFlight_ == 0) idle.notify();
}

kj::Promise<void> CallTracker::whenIdle() {
  if (inFlight_ == 0) return kj::READY_NOW;
  return idle.next();
}

// One accepted call, owned by the call's promise chain. It holds one of the actor's slots while
// the call runs, or waits in the actor's queue for one; finishing or dropping it gives the slot
// back (or leaves the queue) and counts the call out of the tracker.
class CallSlot {
public:
  CallSlot(HostedActor& actor) : actor(actor) { actor.tracker.begin(); }
  ~CallSlot() noexcept(false) { finish(); }
  KJ_DISALLOW_COPY(CallSlot);

  void finish() {
    if (finished) return;
    finished = true;
    if (holdsSlot) {
      actor.releaseSlot();
    } else if (queued) {
      actor.waiting.erase(position);
    }
    actor.tracker.end();
  }

  // Takes a free slot now (true) or joins the queue (false: `started` resolves when a slot
  // is handed over).
  bool acquire() {
    if (actor.options.maxConcurrency == 0 || actor.running < actor.options.maxConcurrency) {
      ++actor.running;
      holdsSlot = true;
      return true;
    }
    auto paf = kj::newPromiseAndFulfiller<void>();
    fulfiller = kj::mv(paf.fulfiller);
    started = kj::mv(paf.promise);
    position = actor.waiting.insert(actor.waiting.end(), this);
    queued = true;
    return false;
  }

  // Called by releaseSlot(): this call now holds the slot its predecessor had.
  void handOver() {
    queued = false;
    holdsSlot = true;
    fulfiller->fulfill();
  }

  kj::Maybe<kj::Promise<void>> started;

private:
  HostedActor& actor;
  bool finished = false;
  bool holdsSlot = false;
  bool queued = false;
  std::list<CallSlot*>::iterator position;
  kj::Own<kj::PromiseFulfiller<void>> fulfiller;
};

CallCompletion::CallCompletion(kj::PromiseFulfiller<void>& fulfiller, CallTracker& tracker,
                               const std::string& actorName, kj::Own<CallSlot> slot,
                               kj::Promise<void> work)
    : fulfiller(fulfiller), tracker(tracker), actorName(actorName), slot(kj::mv(slot)),
      work(nullptr) {
  tracker.calls.add(*this);
  // The call ends when its work completes, not when Cap'n Proto later drops this promise (it
  // keeps it until the caller acknowledges the reply).
  this->work = work.then(
                       [this]() {
                         done();
                         this->fulfiller.fulfill();
                       },
                       [this](kj::Exception&& e) {
                         done();
                         this->fulfiller.reject(asRaisedByActor(kj::mv(e), this->actorName));
                       })
                   .eagerlyEvaluate(nullptr);
}

CallCompletion::~CallCompletion() noexcept(false) {
  // Dropped before the work completed: the caller cancelled.
  done();
}

void CallCompletion::done() {
  KJ_IF_MAYBE(t, tracker) {
    t->calls.remove(*this);
    tracker = nullptr;
    slot->finish();
  }
}

void CallCompletion::abort(const kj::Exception& reason) {
  done();
  fulfiller.reject(kj::cp(reason));
  work = nullptr;
}

bool HostedActor::full() const {
  uint32_t most = options.maxConcurrency;
  return most != 0 && running >= most && waiting.size() >= options.maxQueued;
}

void HostedActor::releaseSlot() {
  if (!waiting.empty()) {
    CallSlot* next = waiting.front();
    waiting.pop_front();
    next->handOver();
  } else {
    --running;
  }
}

namespace {

// Holds a deferred call's result so its completion and its pipeline can go separate ways.
struct StartedCall final : public kj::Refcounted {
  explicit StartedCall(capnp::ClientHook::VoidPromiseAndPipeline&& r) : result(kj::mv(r)) {}
  kj::Own<StartedCall> addRef() { return kj::addRef(*this); }
  capnp::ClientHook::VoidPromiseAndPipeline result;
};

kj::Promise<void> finishing(HostedActor& actor, CallTracker& tracker, kj::Promise<void> work,
                            kj::Own<CallSlot> slot) {
  return kj::newAdaptedPromise<void, CallCompletion>(tracker, actor.name, kj::mv(slot),
                                                     kj::mv(work));
}

const uint GATE_BRAND = 0;

}  // namespace

class ActorGate final : public capnp::ClientHook, public kj::Refcounted {
public:
  explicit ActorGate(HostedActor& actor) : actor(actor) {}

  capnp::Request<capnp::AnyPointer, capnp::AnyPointer> newCall(
      uint64_t interfaceId, uint16_t methodId, kj::Maybe<capnp::MessageSize> sizeHint) override {
    // Requests made in this process go straight to the implementation: troupe only hands the
    // gate to RPC connections, whose calls arrive through call().
    return actor.impl->newCall(interfaceId, methodId, sizeHint);
  }

  VoidPromiseAndPipeline call(uint64_t interfaceId, uint16_t methodId,
                              kj::Own<capnp::CallContextHook>&& context) override {
    if (actor.tracker.draining) {
      auto e = makeError(ErrorCode::DRAINING,
                         kj::str("actor '", actor.name,
                                 "' is draining; the call was not run, send it elsewhere"));
      return {kj::Promise<void>(kj::cp(e)), capnp::newBrokenPipeline(kj::mv(e))};
    }
    if (actor.full()) {
      auto e = makeError(ErrorCode::QUEUE_FULL,
                         kj::str("actor '", actor.name, "' has ", actor.options.maxConcurrency,
                                 " calls in progress and ", actor.options.maxQueued,
                                 " waiting; the call was not run, send it elsewhere or later"));
      return {kj::Promise<void>(kj::cp(e)), capnp::newBrokenPipeline(kj::mv(e))};
    }
    if (actor.options.allowCancellation) context->allowCancellation();

    auto slot = kj::heap<CallSlot>(actor);
    if (slot->acquire()) {
      auto r = actor.impl->call(interfaceId, methodId, kj::mv(context));
      return {finishing(actor, actor.tracker, kj::mv(r.promise), kj::mv(slot)),
              kj::mv(r.pipeline)};
    }

    // Wait for a slot, then start the call.
    auto start = kj::mv(KJ_ASSERT_NONNULL(slot->started))
                     .then([hook = actor.impl->addRef(), interfaceId, methodId,
                            context = kj::mv(context)]() mutable {
                       return kj::refcounted<StartedCall>(
                           hook->call(interfaceId, methodId, kj::mv(context)));
                     })
                     .fork();
    auto pipeline = start.addBranch().then(
        [](kj::Own<StartedCall>&& call) { return kj::mv(call->result.pipeline); });
    auto completion = start.addBranch().then(
        [](kj::Own<StartedCall>&& call) { return kj::mv(call->result.promise); });
    return {finishing(actor, actor.tracker, kj::mv(completion), kj::mv(slot)),
            capnp::newLocalPromisePipeline(kj::mv(pipeline))};
  }

  kj::Maybe<capnp::ClientHook&> getResolved() override { return nullptr; }
  kj::Maybe<kj::Promise<kj::Own<capnp::ClientHook>>> whenMoreResolved() override {
    return nullptr;
  }
  kj::Own<capnp::ClientHook> addRef() override { return kj::addRef(*this); }
  const void* getBrand() override { return &GATE_BRAND; }
  kj::Maybe<int> getFd() override { return nullptr; }

private:
  HostedActor& actor;
};

HostedActor::HostedActor(kj::StringPtr name, capnp::InterfaceSchema schema,
                         capnp::Capability::Client implClient, ActorOptions options,
                         CallTracker& tracker)
    : name(name.cStr()),
      schema(schema),
      options(options),
      impl(capnp::ClientHook::from(kj::mv(implClient))),
      tracker(tracker),
      gate(kj::refcounted<ActorGate>(*this)) {}

capnp::Capability::Client HostedActor::client() {
  return capnp::Capability::Client(gate->addRef());
}

}  // namespace troupe::actor_detail
