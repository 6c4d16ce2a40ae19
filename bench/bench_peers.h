#pragma once
// What the throughput, payload and memory benchmarks share: starting an echo server process,
// a plain Cap'n Proto client with explicit receive options, payloads, and a process's resident
// memory.

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cstdint>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <capnp/message.h>
#include <capnp/rpc-twoparty.h>
#include <kj/async-io.h>

#include "troupe/net/credentials.h"
#include "bench_echo.capnp.h"
#include "tests/support/child_process.h"

namespace troupe::bench {

// Starts bench_echo_server with `args` in `slot` and returns the "host:port" it announced;
// exits the benchmark if it does not start.
inline std::string startEchoServer(std::unique_ptr<troupe::test::ChildProcess>& slot,
                                   std::vector<std::string> args) {
  args.insert(args.end(), {"--addr", "127.0.0.1:0"});
  slot = std::make_unique<troupe::test::ChildProcess>(BENCH_ECHO_SERVER_PATH, args);
  auto line = slot->readLine();
  if (line.rfind("LISTENING ", 0) != 0) {
    fprintf(stderr, "bench_echo_server did not start: '%s'\n", line.c_str());
    exit(1);
  }
  return line.substr(strlen("LISTENING "));
}

#ifdef TROUPE_MAKE_CERTS_PATH
// A CA and a certificate for 127.0.0.1 (scripts/make_certs.sh) in a temporary folder, removed
// when this goes; for a bench_echo_server --tls and the clients that trust it.
struct BenchCerts {
  BenchCerts() {
    char pattern[] = "/tmp/troupe-bench-certs-XXXXXX";
    if (::mkdtemp(pattern) == nullptr) {
      perror("mkdtemp");
      exit(1);
    }
    dir = pattern;
    troupe::test::ChildProcess make(TROUPE_MAKE_CERTS_PATH, {dir});
    if (make.wait(60000) != 0) {
      fprintf(stderr, "scripts/make_certs.sh failed\n");
      exit(1);
    }
  }
  ~BenchCerts() {
    troupe::test::ChildProcess remove("/bin/rm", {"-rf", dir});
    remove.wait();
  }

  // What a client trusting the CA presents: no certificate, no token.
  std::shared_ptr<troupe::Credentials> client() const {
    troupe::TlsOptions tls;
    tls.caFile = dir + "/ca.pem";
    return std::make_shared<troupe::Credentials>(troupe::CredentialsOptions{.tls = tls});
  }

  std::string dir;
};
#endif

inline kj::Array<kj::byte> payloadOf(size_t size) {
  auto data = kj::heapArray<kj::byte>(size);
  for (size_t i = 0; i < size; ++i) data[i] = static_cast<kj::byte>(i * 131 + 7);
  return data;
}

// Receive options accepting messages up to `maxMessageMiB` (0: Cap'n Proto's default, 64 MiB).
// Plain Cap'n Proto also refuses to send a message over its own receive limit.
inline capnp::ReaderOptions readerOptions(uint64_t maxMessageMiB) {
  capnp::ReaderOptions options;
  if (maxMessageMiB > 0)
    options.traversalLimitInWords = (maxMessageMiB << 20) / sizeof(capnp::word);
  return options;
}

// One plain Cap'n Proto RPC connection to a `bench_echo_server --impl capnp` at `hostPort`, on
// kj's own event loop (`io`, which must outlive it): TwoPartyClient without its fixed options.
class PlainCapnpClient {
public:
  PlainCapnpClient(kj::AsyncIoContext& io, const std::string& hostPort,
                   capnp::ReaderOptions options = {})
      : stream(connect(io, hostPort)),
        network(*stream, capnp::rpc::twoparty::Side::CLIENT, options),
        rpc(capnp::makeRpcClient(network)),
        echo(bootstrap()) {}

private:
  // Built in this order: the connection, then the RPC system on it, then the bootstrap call.
  kj::Own<kj::AsyncIoStream> stream;
  capnp::TwoPartyVatNetwork network;
  capnp::RpcSystem<capnp::rpc::twoparty::VatId> rpc;

public:
  BenchEcho::Client echo;

private:
  static kj::Own<kj::AsyncIoStream> connect(kj::AsyncIoContext& io, const std::string& hostPort) {
    auto colon = hostPort.rfind(':');
    auto addr = io.provider->getNetwork()
                    .parseAddress(hostPort.substr(0, colon).c_str(),
                                  static_cast<uint>(atoi(hostPort.c_str() + colon + 1)))
                    .wait(io.waitScope);
    return addr->connect().wait(io.waitScope);
  }

  BenchEcho::Client bootstrap() {
    capnp::MallocMessageBuilder message(8);
    auto vatId = message.getRoot<capnp::rpc::twoparty::VatId>();
    vatId.setSide(capnp::rpc::twoparty::Side::SERVER);
    return rpc.bootstrap(vatId).castAs<BenchEcho>();
  }
};

// Resident memory of process `pid` (0: this one), in bytes, from /proc/<pid>/statm.
inline uint64_t residentBytes(pid_t pid = 0) {
  std::string path = pid == 0 ? "/proc/self/statm" : "/proc/" + std::to_string(pid) + "/statm";
  std::ifstream in(path);
  uint64_t size = 0, resident = 0;
  in >> size >> resident;
  return resident * static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
}

}  // namespace troupe::bench
