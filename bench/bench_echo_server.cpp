// The benchmark servers: an echo actor hosted by troupe's ActorServer, or the same interface
// served by plain Cap'n Proto (kj::setupAsyncIo + capnp::TwoPartyServer) as the baseline.
//
//   bench_echo_server [--impl troupe|capnp] --addr HOST:PORT [--count N]
//
// Prints "LISTENING host:port" once it accepts connections (the peer harness's contract) and
// serves until SIGTERM. With --count N (troupe only), N servers on N ports, one line each.

#include <signal.h>
#include <stdio.h>
#include <string.h>

#include <string>

#include <capnp/rpc-twoparty.h>
#include <kj/async-io.h>
#include <kj/debug.h>
#include <kj/vector.h>

#include "actor/actor_server.h"
#include "actor/address.h"
#include "bench/bench_echo.capnp.h"

namespace {

class EchoImpl final : public troupe::bench::BenchEcho::Server {
protected:
  kj::Promise<void> echo(EchoContext context) override {
    auto in = context.getParams().getPayload();
    context.getResults(capnp::MessageSize{in.size() / sizeof(capnp::word) + 8, 0}).setPayload(in);
    return kj::READY_NOW;
  }
};

void announce(const std::string& host, unsigned port) {
  printf("LISTENING %s:%u\n", host.c_str(), port);
  fflush(stdout);
}

// `count` servers in this process, on one loop, each on its own port (task indexes 0..count-1).
int serveTroupe(const std::string& host, unsigned port, unsigned count) {
  troupe::EventLoop loop;
  kj::Vector<kj::Own<troupe::ActorServer>> servers;
  for (unsigned i = 0; i < count; ++i) {
    troupe::JobContext job;
    job.jobId = "bench";
    job.taskIndex = i;
    job.numTasks = count;
    auto server = kj::heap<troupe::ActorServer>(loop, job);
    server->host<troupe::bench::BenchEcho>("echo", kj::heap<EchoImpl>());
    auto listen = "tcp://" + host + ":" + std::to_string(count == 1 ? port : 0);
    auto bound = troupe::Address::parse(server->listen(listen.c_str()).c_str());
    announce(host, bound.port);
    servers.add(kj::mv(server));
  }
  loop.onSignal({SIGTERM, SIGINT}).wait(loop.waitScope());
  return 0;
}

int serveCapnp(const std::string& host, unsigned port) {
  auto io = kj::setupAsyncIo();
  auto addr = io.provider->getNetwork().parseAddress(host.c_str(), port).wait(io.waitScope);
  auto listener = addr->listen();
  announce(host, listener->getPort());
  capnp::TwoPartyServer server(kj::heap<EchoImpl>());
  server.listen(*listener).wait(io.waitScope);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string impl = "troupe";
  std::string addr = "127.0.0.1:0";
  unsigned count = 1;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (strcmp(argv[i], "--impl") == 0) {
      impl = argv[i + 1];
    } else if (strcmp(argv[i], "--addr") == 0) {
      addr = argv[i + 1];
    } else if (strcmp(argv[i], "--count") == 0) {
      count = static_cast<unsigned>(atoi(argv[i + 1]));
    } else {
      fprintf(stderr, "unknown flag %s\n", argv[i]);
      return 2;
    }
  }
  auto colon = addr.rfind(':');
  if (colon == std::string::npos) {
    fprintf(stderr, "--addr must be HOST:PORT\n");
    return 2;
  }
  std::string host = addr.substr(0, colon);
  unsigned port = static_cast<unsigned>(atoi(addr.c_str() + colon + 1));
  KJ_IF_MAYBE(e, kj::runCatchingExceptions([&]() {
                if (impl == "troupe") {
                  serveTroupe(host, port, count);
                } else if (impl == "capnp") {
                  serveCapnp(host, port);
                } else {
                  KJ_FAIL_REQUIRE("--impl must be troupe or capnp", impl.c_str());
                }
              })) {
    fprintf(stderr, "bench_echo_server: %s\n", e->getDescription().cStr());
    return 1;
  }
  return 0;
}
