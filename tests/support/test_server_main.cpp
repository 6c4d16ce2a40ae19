// A replica for multi-process tests: hosts "calc", "echo", "blocker" (unlimited concurrency) and
// "member" (answers whoami with its endpoint name),
// prints "LISTENING <address> <incarnation>" once serving, then a line per endpoint change
// ("ENDPOINT <name> <state>", "REMOVED <name>"), and serves until SIGTERM/SIGINT. The job id
// defaults to "test" (TROUPE_JOB_ID and the other JobContext variables override it). With
// TROUPE_RESOLVER set it also publishes its endpoints there, and prints "PUBLISHED" once they
// are registered.
//
//   troupe_test_server [--listen ADDR] [--grace-ms N] [--max-message-bytes N]
//                      [--reconnect-window-ms N]

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <kj/debug.h>

#include "troupe/actor/actor_server.h"
#include "troupe/base/event_loop.h"
#include "troupe/resolver/endpoint_publisher.h"
#include "troupe/resolver/open_resolver.h"
#include "tests/support/test_actors.h"

namespace {

class PrintingListener final : public troupe::EndpointListener {
public:
  void endpointChanged(const troupe::Endpoint& e) override {
    printf("ENDPOINT %s %s\n", e.name.c_str(), troupe::toString(e.state).cStr());
    fflush(stdout);
  }
  void endpointRemoved(const troupe::Endpoint& e) override {
    printf("REMOVED %s\n", e.name.c_str());
    fflush(stdout);
  }
};

}  // namespace

int main(int argc, char** argv) {
  kj::StringPtr listen = "tcp://127.0.0.1:0";
  troupe::ActorServerOptions options;
  for (int i = 1; i + 1 < argc; i += 2) {
    kj::StringPtr flag = argv[i];
    if (flag == "--listen") {
      listen = argv[i + 1];
    } else if (flag == "--grace-ms") {
      options.drainGracePeriod = atoi(argv[i + 1]) * kj::MILLISECONDS;
    } else if (flag == "--max-message-bytes") {
      options.maxMessageBytes = strtoull(argv[i + 1], nullptr, 10);
    } else if (flag == "--reconnect-window-ms") {
      options.replies.reconnectWindow = atoi(argv[i + 1]) * kj::MILLISECONDS;
    } else {
      fprintf(stderr, "unknown flag %s\n", argv[i]);
      return 2;
    }
  }
  setenv("TROUPE_JOB_ID", "test", 0);
  troupe::EventLoop loop;
  auto job = troupe::JobContext::fromEnvironment();
  kj::Maybe<kj::Own<troupe::Resolver>> resolver;
  if (!job.resolver.empty()) resolver = troupe::openResolver(loop, job.resolver.c_str());
  troupe::ActorServer server(loop, job, options);
  troupe::test::BlockerState blocker;
  server.host<troupe::test::Calculator>("calc", kj::heap<troupe::test::CalculatorImpl>());
  server.host<troupe::test::Echo>("echo", kj::heap<troupe::test::EchoImpl>(server.incarnation()));
  server.host<troupe::test::Blocker>("blocker", kj::heap<troupe::test::BlockerImpl>(blocker),
                                     {.maxConcurrency = 0});
  server.host<troupe::test::Member>("member", kj::heap<troupe::test::MemberImpl>(
                                                  server.job().endpointName("member")));
  auto bound = server.listen(listen);
  printf("LISTENING %s %llu\n", bound.c_str(), (unsigned long long)server.incarnation());
  fflush(stdout);
  PrintingListener listener;
  auto listening = server.addEndpointListener(listener);
  kj::Maybe<kj::Own<troupe::EndpointPublisher>> publisher;
  KJ_IF_MAYBE(r, resolver) {
    auto p = kj::heap<troupe::EndpointPublisher>(server, **r);
    p->whenPublished().wait(loop.waitScope());
    printf("PUBLISHED\n");
    fflush(stdout);
    publisher = kj::mv(p);
  }
  server.serveUntilSignal();
  return 0;
}
