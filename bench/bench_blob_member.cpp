// A member for blob_bench: an ActorServer that accepts blobs named "weights" into one buffer it
// keeps from blob to blob (as a replica swapping weights in would), hosts "member" (BlobMember:
// its peak memory, and pulling a blob with an ordinary call for comparison), and with --raw also
// runs a plain TCP sink for the raw floor: per connection, an 8-byte size, that many bytes read
// into a buffer, a 1-byte answer.
//
//   bench_blob_member [--listen tcp://HOST:PORT] [--verify] [--raw] [--device cuda:N|host]
//
// With --device the buffer is device memory: a CUDA device's, or with "host" host memory standing
// in for a device (tests/support/host_blob_device.h), for device_bench on machines without a GPU.
// Prints "LISTENING <address>" (and "RAW HOST:PORT" with --raw), then serves until SIGTERM. With
// --verify it computes each blob's XXH3-64 when it arrives (stats() reports it).

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <kj/debug.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "troupe/actor/actor_ref.h"
#include "troupe/actor/actor_server.h"
#include "troupe/actor/blob_device.h"
#include "blob_bench.capnp.h"
#include "bench/bench_blobs.h"
#include "bench/bench_sockets.h"
#include "tests/support/resident_memory.h"

namespace {

using troupe::bench::BlobMember;
using troupe::bench::BlobSource;

uint64_t peakResidentBytes() { return troupe::test::statusBytes("VmHWM:"); }

struct Received {
  uint64_t blobs = 0;
  uint64_t lastBytes = 0;
  uint64_t lastChecksum = 0;
};

class MemberImpl final : public BlobMember::Server {
public:
  MemberImpl(troupe::EventLoop& loop, Received& received) : loop(loop), received(received) {}

protected:
  kj::Promise<void> stats(StatsContext context) override {
    auto r = context.getResults();
    r.setPeakRssBytes(peakResidentBytes());
    r.setBlobs(received.blobs);
    r.setLastBytes(received.lastBytes);
    r.setLastChecksum(received.lastChecksum);
    return kj::READY_NOW;
  }

  kj::Promise<void> resetPeak(ResetPeakContext) override {
    std::ofstream("/proc/self/clear_refs") << "5";
    return kj::READY_NOW;
  }

  kj::Promise<void> pull(PullContext context) override {
    auto source = kj::heap<troupe::ActorRef<BlobSource>>(
        troupe::ActorRef<BlobSource>::connect(loop, context.getParams().getAddress(), "source"));
    auto start = std::chrono::steady_clock::now();
    auto call = source->call([](BlobSource::Client c) { return c.fetchRequest().send(); },
                             {.deadline = 600 * kj::SECONDS});
    return call
        .then([context, start](capnp::Response<BlobSource::FetchResults> r) mutable {
          auto micros = std::chrono::duration_cast<std::chrono::microseconds>(
              std::chrono::steady_clock::now() - start);
          context.getResults().setBytes(r.getData().size());
          context.getResults().setMicros(micros.count());
        })
        .attach(kj::mv(source));
  }

private:
  troupe::EventLoop& loop;
  Received& received;
};

// The raw floor: blocking sockets on a thread of their own.
class RawSink {
public:
  explicit RawSink(const std::string& host) {
    fd = troupe::bench::listenTcp(host, port);
    thread = std::thread([this]() { serve(); });
    thread.detach();  // the process ends with SIGTERM
  }
  uint16_t port = 0;

private:
  void serve() {
    std::vector<char> buffer;
    for (;;) {
      int c = accept(fd, nullptr, nullptr);
      if (c < 0) continue;
      for (;;) {
        uint64_t size = 0;
        if (!readAll(c, reinterpret_cast<char*>(&size), sizeof(size))) break;
        if (buffer.size() < size) buffer.resize(size);
        if (!readAll(c, buffer.data(), size)) break;
        char ok = 1;
        if (write(c, &ok, 1) != 1) break;
      }
      close(c);
    }
  }
  static bool readAll(int c, char* at, uint64_t n) {
    while (n > 0) {
      auto got = read(c, at, std::min<uint64_t>(n, 1 << 30));
      if (got <= 0) return false;
      at += got;
      n -= got;
    }
    return true;
  }
  int fd;
  std::thread thread;
};

}  // namespace

int main(int argc, char** argv) {
  std::string listen = "tcp://127.0.0.1:0";
  bool verify = false;
  bool raw = false;
  std::string device;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--listen" && i + 1 < argc) {
      listen = argv[++i];
    } else if (a == "--device" && i + 1 < argc) {
      device = argv[++i];
    } else if (a == "--verify") {
      verify = true;
    } else if (a == "--raw") {
      raw = true;
    } else {
      fprintf(stderr, "usage: bench_blob_member [--listen ADDRESS] [--verify] [--raw] "
                      "[--device cuda:N|host]\n");
      return 2;
    }
  }
  troupe::EventLoop loop;
  troupe::JobContext job;
  job.jobId = "bench";
  troupe::ActorServer server(loop, job);
  Received received;
  kj::Array<kj::byte> buffer;
  troupe::BlobAcceptOptions options{.acceptStaleVersions = true};
  if (!device.empty()) {
    KJ_IF_MAYBE(e, kj::runCatchingExceptions(
                       [&]() { options.device = troupe::bench::deviceNamed(loop, device); })) {
      fprintf(stderr, "bench_blob_member: --device %s: %s\n", device.c_str(),
              e->getDescription().cStr());
      return 2;
    }
  }
  auto on = options.device;
  server.acceptBlobs(
      "weights",
      [&](const troupe::BlobHeader& h) {
        if (buffer.size() < h.size) {
          buffer = nullptr;
          buffer = on == nullptr ? troupe::allocateBlobMemory(h.size) : on->allocate(h.size);
        }
        return kj::Array<kj::byte>(buffer.begin(), h.size, kj::NullArrayDisposer::instance);
      },
      [&](troupe::Blob b) {
        ++received.blobs;
        received.lastBytes = b.bytes.size();
        if (verify && on == nullptr) {
          received.lastChecksum = XXH3_64bits(b.bytes.begin(), b.bytes.size());
        }
      },
      kj::mv(options));
  server.host<BlobMember>("member", kj::heap<MemberImpl>(loop, received));
  auto address = server.listen(listen.c_str());
  printf("LISTENING %s\n", address.c_str());
  if (raw) {
    auto host = address.substr(strlen("tcp://"));
    host = host.substr(0, host.rfind(':'));
    static RawSink sink(host);
    printf("RAW %s:%u\n", host.c_str(), sink.port);
  }
  fflush(stdout);
  server.serveUntilSignal();
  return 0;
}
