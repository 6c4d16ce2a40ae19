#include "troupe/actor/detail/actor_gate.h"

#include <algorithm>

#include <kj/debug.h>

#include "troupe/actor/detail/once_context.h"
#include "troupe/base/errors.h"
#include "troupe/schemas/actor.capnp.h"

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
// back (or leaves the queue), counts the call out of the tracker and into its method's counters.
class CallSlot {
public:
  // `counters` null: the server does not count calls.
  CallSlot(HostedActor& actor, kj::Maybe<MethodCounters&> counters)
      : actor(actor), counters(counters) {
    actor.tracker.begin();
    KJ_IF_MAYBE(c, counters) {
      arrived = actor.timer.now();
      ++c->started;
      ++c->inFlight;
    }
  }
  ~CallSlot() noexcept(false) { finish(Outcome::CANCELLED, nullptr); }
  KJ_DISALLOW_COPY(CallSlot);

  enum class Outcome : uint8_t { OK, FAILED, CANCELLED };

  // Ends the call's accounting once: `failure` says why when the outcome is FAILED.
  void finish(Outcome outcome, kj::Maybe<const kj::Exception&> failure) {
    if (finished) return;
    finished = true;
    if (holdsSlot) {
      actor.releaseSlot();
    } else if (queued) {
      actor.waiting.erase(position);
    }
    KJ_IF_MAYBE(c, counters) {
      --c->inFlight;
      switch (outcome) {
        case Outcome::OK:
          ++c->outcomes.ok;
          break;
        case Outcome::CANCELLED:
          ++c->outcomes.cancelled;
          break;
        case Outcome::FAILED:
          c->outcomes.countError(errorCode(KJ_ASSERT_NONNULL(failure)));
          break;
      }
      if (outcome != Outcome::CANCELLED) c->latency.record(actor.timer.now() - arrived);
    }
    actor.tracker.end();
  }

  // Takes a free slot now (true) or joins the queue (false: `started` resolves when a slot
  // is handed over).
  bool acquire() {
    if (actor.options.maxConcurrency == 0 || actor.running < actor.options.maxConcurrency) {
      ++actor.running;
      holdsSlot = true;
      if (counters != nullptr) actor.queueWait.record(0 * kj::NANOSECONDS);
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
    if (counters != nullptr) actor.queueWait.record(actor.timer.now() - arrived);
    fulfiller->fulfill();
  }

  kj::Maybe<kj::Promise<void>> started;

private:
  HostedActor& actor;
  kj::Maybe<MethodCounters&> counters;
  kj::TimePoint arrived = kj::origin<kj::TimePoint>();
  bool finished = false;
  bool holdsSlot = false;
  bool queued = false;
  std::list<CallSlot*>::iterator position;
  kj::Own<kj::PromiseFulfiller<void>> fulfiller;
};

CallCompletion::CallCompletion(kj::PromiseFulfiller<void>& fulfiller, CallTracker& tracker,
                               const std::string& actorName, kj::Own<CallSlot> slot,
                               kj::Promise<void> work, kj::Maybe<kj::Own<CallEndListener>> listener)
    : fulfiller(fulfiller),
      tracker(tracker),
      actorName(actorName),
      slot(kj::mv(slot)),
      listener(kj::mv(listener)),
      work(nullptr) {
  tracker.calls.add(*this);
  // The call ends when its work completes, not when Cap'n Proto later drops this promise (it
  // keeps it until the caller acknowledges the reply).
  this->work = work.then(
                       [this]() {
                         done(nullptr);
                         this->fulfiller.fulfill();
                       },
                       [this](kj::Exception&& e) {
                         auto sent = asRaisedByActor(kj::mv(e), this->actorName);
                         done(sent);
                         this->fulfiller.reject(kj::mv(sent));
                       })
                   .eagerlyEvaluate(nullptr);
}

CallCompletion::~CallCompletion() noexcept(false) {
  // Dropped before the work completed: the caller cancelled.
  KJ_IF_MAYBE(t, tracker) {
    t->calls.remove(*this);
    tracker = nullptr;
    slot->finish(CallSlot::Outcome::CANCELLED, nullptr);
  }
}

void CallCompletion::done(kj::Maybe<const kj::Exception&> failure) {
  KJ_IF_MAYBE(t, tracker) {
    t->calls.remove(*this);
    tracker = nullptr;
    slot->finish(failure == nullptr ? CallSlot::Outcome::OK : CallSlot::Outcome::FAILED, failure);
    KJ_IF_MAYBE(l, listener) {
      // Told once, and let go: it may keep the call's messages.
      auto told = kj::mv(*l);
      listener = nullptr;
      told->callEnded(failure);
    }
  }
}

void CallCompletion::abort(const kj::Exception& reason) {
  done(reason);
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
                            kj::Own<CallSlot> slot, kj::Maybe<kj::Own<CallEndListener>> listener) {
  return kj::newAdaptedPromise<void, CallCompletion>(tracker, actor.name, kj::mv(slot),
                                                     kj::mv(work), kj::mv(listener));
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
    if (interfaceId == capnp::typeId<schema::ExactlyOnce>()) {
      return serveOnce(methodId, kj::mv(context));
    }
    return admit(interfaceId, methodId, kj::mv(context));
  }

  kj::Maybe<capnp::ClientHook&> getResolved() override { return nullptr; }
  kj::Maybe<kj::Promise<kj::Own<capnp::ClientHook>>> whenMoreResolved() override { return nullptr; }
  kj::Own<capnp::ClientHook> addRef() override { return kj::addRef(*this); }
  const void* getBrand() override { return &GATE_BRAND; }
  kj::Maybe<int> getFd() override { return nullptr; }

private:
  // Why a call of this method is turned away now (counted as refused); null when it may run.
  kj::Maybe<kj::Exception> refusal(kj::Maybe<MethodCounters&> counters) {
    if (actor.tracker.draining) {
      refused(counters, ErrorCode::DRAINING);
      return makeError(ErrorCode::DRAINING,
                       kj::str("actor '", actor.name,
                               "' is draining; the call was not run, send it elsewhere"));
    }
    if (actor.full()) {
      refused(counters, ErrorCode::QUEUE_FULL);
      return makeError(ErrorCode::QUEUE_FULL,
                       kj::str("actor '", actor.name, "' has ", actor.options.maxConcurrency,
                               " calls in progress and ", actor.options.maxQueued,
                               " waiting; the call was not run, send it elsewhere or later"));
    }
    return nullptr;
  }

  // Runs a call through the gate: admitted (or refused), counted, and held by the tracker.
  // `listener`, if any, is told how the call ended.
  VoidPromiseAndPipeline admit(uint64_t interfaceId, uint16_t methodId,
                               kj::Own<capnp::CallContextHook>&& context,
                               kj::Maybe<kj::Own<CallEndListener>> listener = nullptr) {
    kj::Maybe<MethodCounters&> counters;
    if (actor.counting) counters = actor.countersFor(interfaceId, methodId);
    KJ_IF_MAYBE(e, refusal(counters)) {
      KJ_IF_MAYBE(l, listener) {
        (*l)->callEnded(*e);
      }
      return {kj::Promise<void>(kj::cp(*e)), capnp::newBrokenPipeline(kj::mv(*e))};
    }
    if (actor.options.allowCancellation) context->allowCancellation();

    auto slot = kj::heap<CallSlot>(actor, counters);
    if (slot->acquire()) {
      auto r = actor.impl->call(interfaceId, methodId, kj::mv(context));
      return {finishing(actor, actor.tracker, kj::mv(r.promise), kj::mv(slot), kj::mv(listener)),
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
    return {finishing(actor, actor.tracker, kj::mv(completion), kj::mv(slot), kj::mv(listener)),
            capnp::newLocalPromisePipeline(kj::mv(pipeline))};
  }

  // An ExactlyOnce call: runs the call inside it once per id, however often it arrives.
  VoidPromiseAndPipeline serveOnce(uint16_t methodId, kj::Own<capnp::CallContextHook>&& context) {
    // The reply waits in the cache however the connection fares; the caller may drop its wait.
    context->allowCancellation();
    auto& cache = actor.replies;
    auto params = context->getParams().getAs<schema::ExactlyOnce::CallParams>();
    OnceCallId id{params.getCallerId(), params.getSeq(), params.getIncarnation(),
                  params.getRetry()};
    if (methodId == 1) {
      cache.cancel(id.callerId, id.seq);
      return {kj::READY_NOW, capnp::newBrokenPipeline(KJ_EXCEPTION(FAILED, "no results"))};
    }
    if (methodId != 0) {
      auto e = KJ_EXCEPTION(UNIMPLEMENTED, "no such method of ExactlyOnce", methodId);
      return {kj::Promise<void>(kj::cp(e)), capnp::newBrokenPipeline(kj::mv(e))};
    }
    kj::Promise<kj::Own<StoredReply>> reply = nullptr;
    bool inPlace = false;  // the call runs now and writes its results into this envelope's
    KJ_IF_MAYBE(known, cache.find(id, params.getAckBelow(), params.getAcks())) {
      reply = kj::mv(*known);
    } else {
      uint64_t interfaceId = params.getInterfaceId();
      uint16_t innerMethod = params.getMethodId();
      kj::Maybe<MethodCounters&> counters;
      if (actor.counting) counters = actor.countersFor(interfaceId, innerMethod);
      KJ_IF_MAYBE(e, refusal(counters)) {
        return {kj::Promise<void>(kj::cp(*e)), capnp::newBrokenPipeline(kj::mv(*e))};
      }
      auto inner = kj::refcounted<OnceContext>(context->addRef(), params.getParams());
      if (cache.enabled()) {
        // The call's context keeps its reply in the cache as the call ends.
        auto started = cache.start(id, inner->cancellable);
        inner->keepIn(cache, started.entry);
        auto run = admit(interfaceId, innerMethod, inner->addRef(), kj::addRef(*inner));
        cache.hold(started.entry, kj::mv(run.promise));
        reply = kj::mv(started.reply);
      } else {
        auto run = admit(interfaceId, innerMethod, inner->addRef());
        reply = run.promise.then(
            [inner = kj::mv(inner), maxBytes = cache.maxReplyBytes()]() mutable {
              return inner->takeReply(maxBytes);
            });
      }
      inPlace = true;
    }
    auto pipeline = kj::refcounted<ReplyPipeline>();
    auto& pipelineRef = *pipeline;
    auto done = reply.then(
        [context = kj::mv(context), inPlace,
         pipeline = kj::addRef(pipelineRef)](kj::Own<StoredReply>&& r) mutable {
          pipeline->resolve(r->addRef());
          auto results = context->getResults(nullptr);
          auto out = inPlace ? results.getAs<schema::ExactlyOnce::CallResults>()
                             : results.initAs<schema::ExactlyOnce::CallResults>();
          KJ_IF_MAYBE(e, r->failure()) {
            auto error = out.initError();
            error.setType(static_cast<uint8_t>(e->getType()));
            error.setDescription(e->getDescription());
          } else if (!inPlace) {
            KJ_IF_MAYBE(bytes, r->unkept()) {
              throwError(ErrorCode::MAY_HAVE_RUN,
                         kj::str("the call ran, but its reply of ", *bytes,
                                 " bytes was too large to keep for a retry "
                                 "(ReplyCacheOptions::maxReplyBytes)"));
            }
            r->copyTo(out.initResults());
          }
        },
        [pipeline = kj::addRef(pipelineRef)](kj::Exception&& e) mutable {
          pipeline->fail(e);
          kj::throwFatalException(kj::mv(e));
        });
    return {kj::mv(done), kj::mv(pipeline)};
  }

  // A call turned away before it ran.
  static void refused(kj::Maybe<MethodCounters&> counters, ErrorCode code) {
    KJ_IF_MAYBE(c, counters) {
      ++c->started;
      c->outcomes.countError(code);
    }
  }

  HostedActor& actor;
};

namespace {

// The methods of `schema` and its superclasses, each interface once, the schema's own first in
// index order.
void addMethods(capnp::InterfaceSchema schema, std::vector<MethodCounters>& out,
                std::vector<uint64_t>& seen) {
  uint64_t id = schema.getProto().getId();
  if (std::find(seen.begin(), seen.end(), id) != seen.end()) return;
  seen.push_back(id);
  for (auto method : schema.getMethods()) {
    out.push_back(
        MethodCounters{id, static_cast<uint16_t>(method.getIndex()), method.getProto().getName()});
  }
  for (auto super : schema.getSuperclasses()) addMethods(super, out, seen);
}

}  // namespace

HostedActor::HostedActor(kj::StringPtr name, capnp::InterfaceSchema schema,
                         capnp::Capability::Client implClient, ActorOptions options,
                         CallTracker& tracker, ReplyCache& replies, kj::Timer& timer, bool counting)
    : name(name.cStr()),
      schema(schema),
      options(options),
      impl(capnp::ClientHook::from(kj::mv(implClient))),
      tracker(tracker),
      replies(replies),
      timer(timer),
      counting(counting),
      gate(kj::refcounted<ActorGate>(*this)) {
  std::vector<uint64_t> seen;
  addMethods(schema, methods, seen);
  methods.push_back(MethodCounters{0, 0, "unknown"});
}

MethodCounters& HostedActor::countersFor(uint64_t interfaceId, uint16_t methodId) {
  // The schema's own methods come first, in index order.
  if (interfaceId == schema.getProto().getId() && methodId + 1u < methods.size() &&
      methods[methodId].interfaceId == interfaceId) {
    return methods[methodId];
  }
  for (size_t i = 0; i + 1 < methods.size(); ++i) {
    if (methods[i].interfaceId == interfaceId && methods[i].methodId == methodId) {
      return methods[i];
    }
  }
  return methods.back();
}

void HostedActor::collectMetrics(MetricsSnapshot& out, kj::StringPtr job) const {
  for (auto& m : methods) {
    if (m.interfaceId == 0 && m.started == 0) continue;  // "unknown" stays out until used
    MetricLabels labels = {{"job", job.cStr()}, {"actor", name}, {"method", m.name.cStr()}};
    out.add("troupe_calls_started_total",
            "Calls that reached an actor's gate, including those refused there.",
            MetricType::COUNTER, labels, static_cast<double>(m.started));
    out.add("troupe_calls_in_flight", "Calls accepted and not yet finished, queued ones included.",
            MetricType::GAUGE, labels, static_cast<double>(m.inFlight));
    out.addHistogram("troupe_call_duration_seconds",
                     "Server-side call latency, from arrival at the gate to completion.", labels,
                     m.latency);
    auto withCode = [&](kj::StringPtr code, uint64_t n) {
      auto l = labels;
      l.emplace_back("code", code.cStr());
      out.add("troupe_calls_total",
              "Calls finished, by outcome: ok, cancelled (by the caller), or the error code.",
              MetricType::COUNTER, kj::mv(l), static_cast<double>(n));
    };
    withCode("ok", m.outcomes.ok);
    if (m.outcomes.cancelled != 0) withCode("cancelled", m.outcomes.cancelled);
    for (size_t c = 0; c < CallOutcomes::CODES; ++c) {
      if (m.outcomes.errors[c] != 0) {
        withCode(errorCodeName(static_cast<ErrorCode>(c)), m.outcomes.errors[c]);
      }
    }
  }
  MetricLabels labels = {{"job", job.cStr()}, {"actor", name}};
  out.add("troupe_actor_queue_depth", "Calls waiting at an actor's gate for a place to run.",
          MetricType::GAUGE, labels, static_cast<double>(waiting.size()));
  out.addHistogram("troupe_actor_queue_wait_seconds",
                   "How long calls waited at an actor's gate before they ran.", labels, queueWait);
}

capnp::Capability::Client HostedActor::client() {
  return capnp::Capability::Client(gate->addRef());
}

}  // namespace troupe::actor_detail
