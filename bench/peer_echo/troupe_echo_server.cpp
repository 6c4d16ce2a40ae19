// troupe's echo server for the peer harness (/work/shared/peers): an echo actor hosted by
// ActorServer, with every option at its default (512 MiB message limit, one call at a time).
//
//   troupe_echo_server --addr HOST:PORT      (port 0: any free port)
//   troupe_echo_server --addr unix:PATH      (same host: large messages through shared memory)
//
// Prints "LISTENING host:port" (or "LISTENING unix:PATH") once it accepts connections and serves
// until SIGTERM or SIGINT.

#include <signal.h>
#include <stdio.h>
#include <string.h>

#include <string>

#include <kj/debug.h>

#include "troupe/actor/actor_server.h"
#include "troupe/net/address.h"
#include "bench_echo.capnp.h"
#include "bench/bench_echo_impl.h"
#include "bench/peer_echo/peer_flags.h"

namespace {

int usage(const char* why) {
  fprintf(stderr, "troupe_echo_server: %s\nusage: troupe_echo_server --addr HOST:PORT|unix:PATH\n",
          why);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::string addr;
  for (int i = 1; i < argc; ++i) {
    std::string flag, value;
    if (!troupe::bench::takeFlag(argc, argv, i, flag, value)) {
      return usage(("missing value for " + flag).c_str());
    }
    if (flag != "--addr") return usage(("unknown flag " + flag).c_str());
    addr = value;
  }
  // unix:/path: a unix socket, where large messages go through shared memory (same host).
  bool unix = addr.rfind("unix:", 0) == 0;
  auto colon = addr.rfind(':');
  if (!unix && (colon == std::string::npos || colon == 0 || colon + 1 == addr.size())) {
    return usage("--addr must be HOST:PORT or unix:PATH");
  }
  std::string host = addr.substr(0, colon);

  KJ_IF_MAYBE(e, kj::runCatchingExceptions([&]() {
                troupe::EventLoop loop;
                troupe::JobContext job;
                job.jobId = "peer";
                troupe::ActorServer server(loop, job);
                server.host<troupe::bench::BenchEcho>("echo", kj::heap<troupe::bench::EchoImpl>());
                if (unix) {
                  server.listen(addr.c_str());
                  printf("LISTENING %s\n", addr.c_str());
                } else {
                  auto bound = troupe::Address::parse(
                      server.listen(("tcp://" + addr).c_str()).c_str());
                  printf("LISTENING %s:%u\n", host.c_str(), unsigned(bound.port));
                }
                fflush(stdout);
                loop.onSignal({SIGTERM, SIGINT}).wait(loop.waitScope());
              })) {
    fprintf(stderr, "troupe_echo_server: %s\n", e->getDescription().cStr());
    return 1;
  }
  return 0;
}
