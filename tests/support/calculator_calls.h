#pragma once
// Calls to the test Calculator (test_actors.capnp) through an ActorRef, for tests that count
// them.

#include <kj/async.h>

#include "troupe/actor/actor_ref.h"
#include "tests/support/test_actors.h"

namespace troupe::test {

// a + b; rejects (FAILED, raised by the actor) when the sum overflows.
inline kj::Promise<int64_t> add(ActorRef<Calculator>& calc, int64_t a, int64_t b) {
  return calc
      .call([a, b](Calculator::Client c) {
        auto r = c.addRequest();
        r.setA(a);
        r.setB(b);
        return r.send();
      })
      .then([](capnp::Response<Calculator::AddResults>&& r) { return r.getSum(); });
}

// a / b; rejects (FAILED, raised by the actor) for b == 0.
inline kj::Promise<int64_t> divide(ActorRef<Calculator>& calc, int64_t a, int64_t b) {
  return calc
      .call([a, b](Calculator::Client c) {
        auto r = c.divideRequest();
        r.setA(a);
        r.setB(b);
        return r.send();
      })
      .then([](capnp::Response<Calculator::DivideResults>&& r) { return r.getQuotient(); });
}

}  // namespace troupe::test
