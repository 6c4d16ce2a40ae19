#include "tests/chaos/call_load.h"

#include <kj/debug.h>

namespace troupe::chaos {

const char* toString(CallKind kind) {
  return kind == CallKind::IDEMPOTENT ? "idempotentOp" : "recordOnce";
}

CallLoad::CallLoad(EventLoop& loop, ActorPool<Chaos>& pool, Random& random, CallLoadOptions options)
    : loop(loop), pool(pool), random(random), options_(kj::mv(options)) {}

kj::Promise<void> CallLoad::run(kj::TimePoint until) {
  auto lanes = kj::heapArrayBuilder<kj::Promise<void>>(options_.lanes);
  for (uint32_t i = 0; i < options_.lanes; ++i) lanes.add(lane(until));
  return kj::joinPromises(lanes.finish());
}

kj::Promise<void> CallLoad::lane(kj::TimePoint until) {
  if (loop.timer().now() >= until) return kj::READY_NOW;
  auto kind = random.below(2) == 0 ? CallKind::IDEMPOTENT : CallKind::RECORD_ONCE;
  return call(nextId++, kind).then([this, until](CallRecord&& record) {
    records_.push_back(kj::mv(record));
    return lane(until);
  });
}

kj::Promise<CallRecord> CallLoad::call(uint64_t id, CallKind kind) {
  CallRecord record;
  record.id = id;
  record.kind = kind;
  record.start = loop.timer().now();
  CallOptions options{.deadline = options_.deadline, .idempotent = kind == CallKind::IDEMPOTENT};
  kj::Promise<void> sent = nullptr;
  if (kind == CallKind::IDEMPOTENT) {
    sent = pool.call(
                   [id](Chaos::Client c) {
                     auto request = c.idempotentOpRequest();
                     request.setCallId(id);
                     return request.send();
                   },
                   options)
               .ignoreResult();
  } else {
    sent = pool.call(
                   [id](Chaos::Client c) {
                     auto request = c.recordOnceRequest();
                     request.setCallId(id);
                     return request.send();
                   },
                   options)
               .ignoreResult();
  }
  // The limit fires first only when the call's promise has not settled: it hung, and dropping
  // it here keeps the run bounded.
  struct Outcome {
    bool settled;
    kj::Maybe<kj::Exception> error;
  };
  auto settled = sent.then(
      []() {
        return Outcome{true, nullptr};
      },
      [](kj::Exception&& e) {
        return Outcome{true, kj::mv(e)};
      });
  auto limit = loop.timer().afterDelay(options_.deadline + options_.hangLimit).then([]() {
    return Outcome{false, nullptr};
  });
  return settled.exclusiveJoin(kj::mv(limit))
      .then([this, record = kj::mv(record)](Outcome&& outcome) mutable {
        record.took = loop.timer().now() - record.start;
        record.hung = !outcome.settled;
        KJ_IF_MAYBE(e, outcome.error) {
          record.error = errorCode(*e);
          record.message = e->getDescription().cStr();
        }
        return kj::mv(record);
      });
}

}  // namespace troupe::chaos
