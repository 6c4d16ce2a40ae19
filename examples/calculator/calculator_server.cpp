// A replica hosting one Calculator actor. Run it, note the address it prints, then run
// calculator_client against it; Ctrl-C (or SIGTERM) drains and stops it. With TROUPE_RESOLVER
// set (e.g. registry://127.0.0.1:7700) it also publishes itself there as
// <TROUPE_JOB_ID>/calc-<TROUPE_TASK_INDEX>, for clients that find it through a pool.
//
//   calculator_server [--listen ADDRESS]     (default tcp://127.0.0.1:0, tls:// with TLS set up)

#include <stdio.h>

#include <numeric>
#include <vector>

#include <kj/debug.h>
#include <spdlog/spdlog.h>

#include <troupe/actor/actor_server.h>
#include <troupe/base/errors.h>
#include <troupe/resolver/host_actor.h>

#include "calculator.capnp.h"

namespace {

class CalculatorImpl final : public calculator::Calculator::Server {
public:
  explicit CalculatorImpl(troupe::EventLoop& loop) : loop(loop) {}

protected:
  kj::Promise<void> add(AddContext context) override {
    ++served;
    auto p = context.getParams();
    context.getResults().setValue(p.getA() + p.getB());
    return kj::READY_NOW;
  }

  kj::Promise<void> divide(DivideContext context) override {
    ++served;
    auto p = context.getParams();
    // An exception reaches the caller as a FAILED error carrying this message.
    if (p.getB() == 0) KJ_FAIL_REQUIRE("cannot divide by zero");
    context.getResults().setValue(p.getA() / p.getB());
    return kj::READY_NOW;
  }

  kj::Promise<void> sum(SumContext context) override {
    ++served;
    // Copy the input, then add it up on a worker thread so the loop keeps serving.
    auto in = context.getParams().getValues();
    std::vector<double> values;
    values.reserve(in.size());
    for (double v : in) values.push_back(v);
    return loop
        .offload([values = std::move(values)]() {
          return std::accumulate(values.begin(), values.end(), 0.0);
        })
        .then([context](double total) mutable { context.getResults().setValue(total); });
  }

  kj::Promise<void> calls(CallsContext context) override {
    context.getResults().setCount(++served);
    return kj::READY_NOW;
  }

private:
  troupe::EventLoop& loop;
  uint64_t served = 0;
};

}  // namespace

int main(int argc, char** argv) {
  // TLS and the cluster token come from the environment (TROUPE_TLS_*, TROUPE_TOKEN_FILE).
  troupe::EventLoop loop({.logger = spdlog::default_logger()});
  troupe::ActorServer server(loop, troupe::JobContext::fromEnvironment());
  server.host<calculator::Calculator>("calc", kj::heap<CalculatorImpl>(loop));
  // By default 127.0.0.1, over TLS when the environment names a certificate.
  std::string listen = server.defaultListenAddress();
  if (argc == 3 && kj::StringPtr(argv[1]) == "--listen") listen = argv[2];
  KJ_IF_MAYBE(e, kj::runCatchingExceptions([&]() {
                auto address = troupe::listenGuarded(server, listen.c_str());
                printf("calculator serving at %s as %s\n", address.c_str(),
                       server.job().endpointName("calc").c_str());
                fflush(stdout);
                troupe::serveReplica(loop, server);
              })) {
    fprintf(stderr, "calculator_server: %s\n", troupe::errorMessage(*e).cStr());
    return 1;
  }
  return 0;
}
