// The benchmark servers: an echo actor hosted by troupe's ActorServer, or the same interface
// served by plain Cap'n Proto (kj::setupAsyncIo + capnp::TwoPartyServer) as the baseline.
//
//   bench_echo_server [--impl troupe|capnp|raw] --addr HOST:PORT [--count N] [--actors N]
//                     [--tls CERTS_DIR]   (troupe over tls://, make_certs.sh's certificates)
//                     [--metrics on|off]  (troupe: count and time calls: ActorServerOptions)
//                     [--replies on|off]  (troupe: keep ExactlyOnce calls' replies:
//                                          ReplyCacheOptions::enabled)
//                     [--max-message-mib M]
//                     [--unix PATH]       (troupe, one server: also listen on unix:PATH)
//
// Prints "LISTENING host:port" once it accepts connections (the peer harness's contract) and
// serves until SIGTERM. With --count N (troupe only), N servers on N ports, one line each.
// With --actors N (troupe only), each server hosts N echo actors: "echo", "echo1", ...
// "echo<N-1>". With --max-message-mib M, messages up to M MiB are accepted: troupe's
// maxMessageBytes, or for plain Cap'n Proto the receive traversal limit, which also bounds what
// it sends (its default, 64 MiB, refuses a 64 MiB payload). --impl raw is no RPC at all: each
// connection gets back the bytes it sends (epoll, one read and one write per wake-up), the
// floor under a broadcast's cost per member.

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <string>

#include <capnp/rpc-twoparty.h>
#include <kj/async-io.h>
#include <kj/debug.h>
#include <kj/vector.h>

#include "troupe/actor/actor_server.h"
#include "troupe/net/address.h"
#include "bench_echo.capnp.h"
#include "bench/bench_echo_impl.h"
#include "bench/bench_sockets.h"

namespace {

void announce(const std::string& host, unsigned port) {
  printf("LISTENING %s:%u\n", host.c_str(), port);
  fflush(stdout);
}

struct Settings {
  unsigned count = 1;
  unsigned actors = 1;
  uint64_t maxMessageMiB = 0;  // 0: the implementation's default
  std::string tlsDir;          // troupe only: serve tls:// with DIR/node.pem and DIR/node.key
  bool metrics = true;         // troupe only: ActorServerOptions::metrics
  bool replies = true;         // troupe only: ReplyCacheOptions::enabled
  std::string unixPath;        // troupe only, one server: also listen on unix:PATH
};

// `count` servers in this process, on one loop, each on its own port (task indexes 0..count-1).
int serveTroupe(const std::string& host, unsigned port, const Settings& settings) {
  unsigned count = settings.count;
  troupe::EventLoop loop;
  kj::Vector<kj::Own<troupe::ActorServer>> servers;
  troupe::ActorServerOptions options;
  if (settings.maxMessageMiB > 0) options.maxMessageBytes = settings.maxMessageMiB << 20;
  options.metrics = settings.metrics;
  options.replies.enabled = settings.replies;
  std::string scheme = "tcp://";
  if (!settings.tlsDir.empty()) {
    troupe::TlsOptions tls;
    tls.caFile = settings.tlsDir + "/ca.pem";
    tls.certFile = settings.tlsDir + "/node.pem";
    tls.keyFile = settings.tlsDir + "/node.key";
    options.credentials = std::make_shared<troupe::Credentials>(
        troupe::CredentialsOptions{.tls = tls});
    scheme = "tls://";
  }
  for (unsigned i = 0; i < count; ++i) {
    troupe::JobContext job;
    job.jobId = "bench";
    job.taskIndex = i;
    job.numTasks = count;
    auto server = kj::heap<troupe::ActorServer>(loop, job, options);
    server->host<troupe::bench::BenchEcho>("echo", kj::heap<troupe::bench::EchoImpl>());
    for (unsigned a = 1; a < settings.actors; ++a) {
      server->host<troupe::bench::BenchEcho>(kj::str("echo", a),
                                             kj::heap<troupe::bench::EchoImpl>());
    }
    auto listen = scheme + host + ":" + std::to_string(count == 1 ? port : 0);
    auto bound = troupe::Address::parse(server->listen(listen.c_str()).c_str());
    if (!settings.unixPath.empty()) server->listen(("unix:" + settings.unixPath).c_str());
    announce(host, bound.port);
    servers.add(kj::mv(server));
  }
  loop.onSignal({SIGTERM, SIGINT}).wait(loop.waitScope());
  return 0;
}

// One plain Cap'n Proto connection with explicit receive options (what TwoPartyServer does per
// connection, which offers no way to pass them).
struct CapnpConnection {
  CapnpConnection(kj::Own<kj::AsyncIoStream> stream, capnp::Capability::Client bootstrap,
                  capnp::ReaderOptions options)
      : stream(kj::mv(stream)),
        network(*this->stream, capnp::rpc::twoparty::Side::SERVER, options),
        rpc(capnp::makeRpcServer(network, kj::mv(bootstrap))) {}
  kj::Own<kj::AsyncIoStream> stream;
  capnp::TwoPartyVatNetwork network;
  capnp::RpcSystem<capnp::rpc::twoparty::VatId> rpc;
};

class LogErrors final : public kj::TaskSet::ErrorHandler {
public:
  void taskFailed(kj::Exception&& e) override {
    fprintf(stderr, "bench_echo_server: connection failed: %s\n", e.getDescription().cStr());
  }
};

kj::Promise<void> acceptCapnp(kj::ConnectionReceiver& listener, capnp::Capability::Client echo,
                              capnp::ReaderOptions options, kj::TaskSet& connections) {
  return listener.accept().then(
      [&listener, echo, options, &connections](kj::Own<kj::AsyncIoStream> stream) mutable {
        auto connection = kj::heap<CapnpConnection>(kj::mv(stream), echo, options);
        auto& network = connection->network;
        connections.add(network.onDisconnect().attach(kj::mv(connection)));
        return acceptCapnp(listener, kj::mv(echo), options, connections);
      });
}

int serveCapnp(const std::string& host, unsigned port, const Settings& settings) {
  auto io = kj::setupAsyncIo();
  auto addr = io.provider->getNetwork().parseAddress(host.c_str(), port).wait(io.waitScope);
  auto listener = addr->listen();
  announce(host, listener->getPort());
  if (settings.maxMessageMiB == 0) {
    capnp::TwoPartyServer server(kj::heap<troupe::bench::EchoImpl>());
    server.listen(*listener).wait(io.waitScope);
    return 0;
  }
  capnp::ReaderOptions options;
  options.traversalLimitInWords = (settings.maxMessageMiB << 20) / sizeof(capnp::word);
  LogErrors errors;
  kj::TaskSet connections(errors);
  acceptCapnp(*listener, kj::heap<troupe::bench::EchoImpl>(), options, connections)
      .wait(io.waitScope);
  return 0;
}

// Echoes every connection's bytes back on one IPv4 port until killed.
int serveRaw(const std::string& host, unsigned port) {
  auto bound = static_cast<uint16_t>(port);
  int listener = troupe::bench::listenTcp(host, bound);
  int poll = ::epoll_create1(EPOLL_CLOEXEC);
  struct epoll_event event = {};
  event.events = EPOLLIN;
  event.data.fd = listener;
  KJ_SYSCALL(::epoll_ctl(poll, EPOLL_CTL_ADD, listener, &event));
  announce(host, bound);
  for (;;) {
    struct epoll_event ready[256];
    int n = ::epoll_wait(poll, ready, 256, -1);
    for (int i = 0; i < n; ++i) {
      int fd = ready[i].data.fd;
      if (fd == listener) {
        int connection = ::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
        if (connection < 0) continue;
        int one = 1;
        ::setsockopt(connection, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        event.data.fd = connection;
        ::epoll_ctl(poll, EPOLL_CTL_ADD, connection, &event);
        continue;
      }
      char buffer[65536];
      ssize_t got = ::read(fd, buffer, sizeof(buffer));
      if (got <= 0 || ::write(fd, buffer, got) != got) ::close(fd);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::string impl = "troupe";
  std::string addr = "127.0.0.1:0";
  Settings settings;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (strcmp(argv[i], "--impl") == 0) {
      impl = argv[i + 1];
    } else if (strcmp(argv[i], "--addr") == 0) {
      addr = argv[i + 1];
    } else if (strcmp(argv[i], "--count") == 0) {
      settings.count = static_cast<unsigned>(atoi(argv[i + 1]));
    } else if (strcmp(argv[i], "--actors") == 0) {
      settings.actors = static_cast<unsigned>(atoi(argv[i + 1]));
    } else if (strcmp(argv[i], "--tls") == 0) {
      settings.tlsDir = argv[i + 1];
    } else if (strcmp(argv[i], "--metrics") == 0) {
      settings.metrics = strcmp(argv[i + 1], "off") != 0;
    } else if (strcmp(argv[i], "--replies") == 0) {
      settings.replies = strcmp(argv[i + 1], "off") != 0;
    } else if (strcmp(argv[i], "--unix") == 0) {
      settings.unixPath = argv[i + 1];
    } else if (strcmp(argv[i], "--max-message-mib") == 0) {
      settings.maxMessageMiB = strtoull(argv[i + 1], nullptr, 10);
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
                  serveTroupe(host, port, settings);
                } else if (impl == "capnp") {
                  serveCapnp(host, port, settings);
                } else if (impl == "raw") {
                  serveRaw(host, port);
                } else {
                  KJ_FAIL_REQUIRE("--impl must be troupe, capnp or raw", impl.c_str());
                }
              })) {
    fprintf(stderr, "bench_echo_server: %s\n", e->getDescription().cStr());
    return 1;
  }
  return 0;
}
