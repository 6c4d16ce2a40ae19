// Calls the Calculator actor of a running calculator_server.
//
//   calculator_client ADDRESS        (e.g. tcp://127.0.0.1:40123)

#include <stdio.h>

#include <kj/debug.h>

#include <troupe/actor/actor_ref.h>
#include <troupe/base/errors.h>

#include "calculator.capnp.h"

using calculator::Calculator;

int main(int argc, char** argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s ADDRESS\n", argv[0]);
    return 2;
  }
  troupe::EventLoop loop;
  auto& ws = loop.waitScope();
  auto calc = troupe::ActorRef<Calculator>::connect(loop, argv[1], "calc");

  // One call, with a deadline.
  auto sum = calc.call(
                     [](Calculator::Client c) {
                       auto q = c.addRequest();
                       q.setA(1.5);
                       q.setB(2.25);
                       return q.send();
                     },
                     {.deadline = 2 * kj::SECONDS})
                 .wait(ws);
  printf("add(1.5, 2.25) = %g\n", sum.getValue());

  // Several calls in flight at once; the actor runs them one at a time.
  auto calls = kj::heapArrayBuilder<kj::Promise<double>>(4);
  for (int i = 1; i <= 4; ++i) {
    calls.add(calc.call([i](Calculator::Client c) {
                    auto q = c.divideRequest();
                    q.setA(100);
                    q.setB(i);
                    return q.send();
                  })
                  .then([](auto r) { return r.getValue(); }));
  }
  auto quotients = kj::joinPromises(calls.finish()).wait(ws);
  printf("100 / 1..4 = %g %g %g %g\n", quotients[0], quotients[1], quotients[2], quotients[3]);

  // Work the actor offloads to a worker thread.
  auto total = calc.call([](Calculator::Client c) {
                     auto q = c.sumRequest();
                     auto values = q.initValues(1000);
                     for (uint i = 0; i < 1000; ++i) values.set(i, i + 1);
                     return q.send();
                   })
                   .wait(ws);
  printf("sum(1..1000) = %g\n", total.getValue());

  // An exception raised by the actor comes back as a FAILED error with its message.
  try {
    calc.call([](Calculator::Client c) {
          auto q = c.divideRequest();
          q.setA(1);
          q.setB(0);
          return q.send();
        })
        .wait(ws);
    printf("divide(1, 0) unexpectedly succeeded\n");
    return 1;
  } catch (const kj::Exception& e) {
    printf("divide(1, 0) failed as expected: %s (%s)\n",
           troupe::errorCodeName(troupe::errorCode(e)).cStr(), e.getDescription().cStr());
  }

  auto served = calc.call([](Calculator::Client c) { return c.callsRequest().send(); }).wait(ws);
  printf("the actor has served %llu calls; server incarnation %llu\n",
         (unsigned long long)served.getCount(),
         (unsigned long long)KJ_ASSERT_NONNULL(calc.incarnation()));
  return 0;
}
