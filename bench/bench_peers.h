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

inline kj::Array<kj::byte> payloadOf(size_t size) {
  auto data = kj::heapArray<kj::byte>(size);
  for (size_t i = 0; i < size; ++i) data[i] = static_cast<kj::byte>(i * 131 + 7);
  return data;
}

// Receive options accepting messages up to `maxMessageMiB` (0: Cap'n Proto's default, 64 MiB).
// Plain Cap'n Proto also refuses to send a message over its own receive limit.
inline capnp::ReaderOptions readerOptions(uint64_t maxMessageMiB) {
  capnp::ReaderOptions options;
  if (maxMessageMiB > 0) options.traversalLimitInWords = (maxMessageMiB << 20) / sizeof(capnp::word);
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
