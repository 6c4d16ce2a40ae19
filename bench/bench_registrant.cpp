// A process that registers many endpoints at once, for discovery_bench: opens the resolver URL,
// registers "scale/e-0" ... "scale/e-<N-1>", prints "REGISTERED <N>" once every one is in, and
// keeps them until it is killed.
//
//   bench_registrant URL N

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>

#include <string>

#include <kj/async.h>

#include "troupe/base/event_loop.h"
#include "troupe/net/credentials.h"
#include "troupe/resolver/open_resolver.h"

int main(int argc, char** argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: %s URL N\n", argv[0]);
    return 2;
  }
  size_t n = strtoull(argv[2], nullptr, 10);
  troupe::EventLoop loop;
  troupe::setLoopCredentials(loop, troupe::Credentials::none());
  auto resolver = troupe::openResolver(loop, argv[1]);
  kj::Vector<kj::Own<troupe::Registration>> registrations;
  kj::Vector<kj::Promise<void>> registered;
  for (size_t i = 0; i < n; ++i) {
    troupe::Endpoint e;
    e.name = "scale/e-" + std::to_string(i);
    e.address = "tcp://127.0.0.1:" + std::to_string(10000 + i % 50000);
    e.incarnation = 1;
    e.state = troupe::EndpointState::READY;
    registrations.add(resolver->registerEndpoint(e));
    registered.add(registrations.back()->whenRegistered());
  }
  kj::joinPromises(registered.releaseAsArray()).wait(loop.waitScope());
  printf("REGISTERED %zu\n", n);
  fflush(stdout);
  loop.onSignal({SIGTERM, SIGINT}).wait(loop.waitScope());
  return 0;
}
