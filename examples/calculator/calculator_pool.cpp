// Finds the replicas of a calculator job through a resolver and uses them as a pool: calls that
// go round-robin, then a broadcast with one result per replica.
//
//   calculator_pool RESOLVER_URL JOB_ID REPLICAS     (e.g. registry://127.0.0.1:7700 calc 3)

#include <stdio.h>
#include <stdlib.h>

#include <kj/debug.h>

#include <troupe/base/errors.h>
#include <troupe/base/parse_number.h>
#include <troupe/pool/actor_pool.h>
#include <troupe/resolver/open_resolver.h>

#include "calculator.capnp.h"

using calculator::Calculator;

int main(int argc, char** argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: %s RESOLVER_URL JOB_ID REPLICAS\n", argv[0]);
    return 2;
  }
  size_t replicas = troupe::parseWholeNumber(kj::StringPtr(argv[3]), 1000).orDefault(0);
  if (replicas == 0) {
    fprintf(stderr, "%s: REPLICAS must be a whole number from 1 to 1000, not '%s'\n", argv[0],
            argv[3]);
    return 2;
  }
  troupe::EventLoop loop;
  auto& ws = loop.waitScope();
  auto resolver = troupe::openResolver(loop, argv[1]);

  // Wait until every replica has registered and is serving.
  troupe::ActorGroup<Calculator> group(loop, *resolver, argv[2], "calc");
  auto ready = group.waitReady(replicas, 30 * kj::SECONDS).wait(ws);
  printf("%zu of %zu replicas ready:", ready.size(), replicas);
  for (auto& e : ready) printf(" %s", e.name.c_str());
  printf("\n");

  // Calls through the pool go to one replica each, round-robin.
  troupe::ActorPool<Calculator> pool(group);
  for (int i = 1; i <= 2 * static_cast<int>(replicas); ++i) {
    auto r = pool.call(
                     [i](Calculator::Client c) {
                       auto q = c.addRequest();
                       q.setA(i);
                       q.setB(i);
                       return q.send();
                     },
                     {.deadline = 5 * kj::SECONDS, .idempotent = true})
                 .wait(ws);
    printf("pool: add(%d, %d) = %g\n", i, i, r.getValue());
  }

  // A broadcast reaches every replica; each result says who answered and how fast.
  auto results = pool.broadcast([](Calculator::Client c) { return c.callsRequest().send(); })
                     .waitAll(5 * kj::SECONDS)
                     .wait(ws);
  for (auto& r : results) {
    KJ_IF_MAYBE(value, r.value) {
      printf("broadcast: %s has served %llu calls (%.0f us)\n", r.endpoint.name.c_str(),
             (unsigned long long)value->getCount(), r.latency / kj::MICROSECONDS * 1.0);
    } else {
      printf("broadcast: %s failed: %s\n", r.endpoint.name.c_str(),
             KJ_ASSERT_NONNULL(r.error).getDescription().cStr());
    }
  }

  // The sum of 1..1000, split across the replicas (each adds its slice off its event loop).
  auto slices = pool.broadcast([replicas, index = size_t{0}](Calculator::Client c) mutable {
                      auto q = c.sumRequest();
                      size_t begin = 1000 * index / replicas, end = 1000 * (index + 1) / replicas;
                      ++index;
                      auto values = q.initValues(end - begin);
                      for (size_t i = begin; i < end; ++i) values.set(i - begin, i + 1);
                      return q.send();
                    })
                    .waitAll(5 * kj::SECONDS)
                    .wait(ws);
  double total = 0;
  for (auto& r : slices) total += KJ_ASSERT_NONNULL(r.value).getValue();
  printf("sum(1..1000) across %zu replicas = %g\n", slices.size(), total);
  return 0;
}
