// Blobs (actor/blob.h) at full size, in one run:
//
//  * BM_Blob_Loopback/<MiB>: one streamed transfer to one member (bench_blob_member) over
//    loopback, beside BM_RawTcp_Loopback/<MiB>: the same bytes written to a plain TCP socket and
//    read into a buffer on the other side (one way, the floor). Bytes/s, and each side's peak
//    resident memory during the transfer above the payload ("sender_extra_mib",
//    "member_extra_mib": the member's buffer is the payload).
//  * BM_Net_*: 8 members over a simulated network (netsim.h: one network namespace per host,
//    each host's link rate-limited in both directions; needs root), 256 MiB from a sender on a
//    link of its own: BM_Net_Single (one member: one transfer over one link, the reference),
//    BM_Net_Broadcast/<fanout> for STAR, CHAIN and TREE, and BM_Net_Pull (every member pulls the
//    blob from the sender with one ordinary call, what a user would do without blobs).
//
//   build/bin/blob_bench --benchmark_repetitions=3 --benchmark_report_aggregates_only=true
//   build/bin/blob_bench --benchmark_filter=Huge     # 4 GiB on loopback (9 GiB of memory)
//   TROUPE_BENCH_LINK=1gbit build/bin/blob_bench --benchmark_filter=Net   # another link rate
//   TROUPE_BENCH_CHUNK_KIB=1024 TROUPE_BENCH_WINDOW_KIB=8192 ...          # the Net options
//
// Each iteration sends a new version; times are wall-clock from the send to the last member's
// result (manual time). Placement is left to the scheduler: a bulk transfer keeps both ends
// busy, and the raw floor runs the same way.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <benchmark/benchmark.h>
#include <kj/debug.h>

#include "troupe/actor/actor_ref.h"
#include "troupe/actor/actor_server.h"
#include "troupe/actor/blob.h"
#include "troupe/actor/detail/blob_fanout.h"
#include "troupe/net/bytes.h"
#include "blob_bench.capnp.h"
#include "bench/bench_blobs.h"
#include "bench/bench_sockets.h"
#include "bench/bench_support.h"
#include "bench/netsim.h"
#include "tests/support/child_process.h"
#include "tests/support/resident_memory.h"

namespace {

using troupe::bench::BlobMember;
using troupe::bench::BlobSource;
using troupe::bench::borrowed;
using troupe::bench::payload;
using Clock = std::chrono::steady_clock;
constexpr uint64_t MiB = 1 << 20;
constexpr int NET_MEMBERS = 8;
constexpr uint64_t NET_BYTES = 256 * MiB;

uint64_t peakResidentBytes() { return troupe::test::statusBytes("VmHWM:"); }

void resetPeak() { std::ofstream("/proc/self/clear_refs") << "5"; }

// A bench_blob_member child and its address.
struct MemberProcess {
  MemberProcess(std::vector<std::string> prefix, std::string listen, bool raw) {
    auto args = prefix;
    std::string program = BENCH_BLOB_MEMBER_PATH;
    if (!prefix.empty()) {
      program = prefix[0];
      args.erase(args.begin());
      args.push_back(BENCH_BLOB_MEMBER_PATH);
    }
    args.push_back("--listen");
    args.push_back(listen);
    if (raw) args.push_back("--raw");
    process = std::make_unique<troupe::test::ChildProcess>(program, args);
    auto line = process->readLine(30000);
    KJ_REQUIRE(line.rfind("LISTENING ", 0) == 0, "the member did not start", line);
    address = line.substr(strlen("LISTENING "));
    if (raw) {
      line = process->readLine(30000);
      KJ_REQUIRE(line.rfind("RAW ", 0) == 0, "the member's raw sink did not start", line);
      rawAddress = line.substr(strlen("RAW "));
    }
  }
  ~MemberProcess() {
    process->kill(SIGTERM);
    process->wait(10000);
  }
  std::unique_ptr<troupe::test::ChildProcess> process;
  std::string address;
  std::string rawAddress;
};

struct MemberStats {
  uint64_t peak = 0;
  uint64_t blobs = 0;
};

MemberStats statsOf(troupe::EventLoop& loop, const std::string& address) {
  auto ref = troupe::ActorRef<BlobMember>::connect(loop, address.c_str(), "member");
  auto r =
      ref.call([](BlobMember::Client c) { return c.statsRequest().send(); }).wait(loop.waitScope());
  return {r.getPeakRssBytes(), r.getBlobs()};
}

void resetPeakOf(troupe::EventLoop& loop, const std::string& address) {
  auto ref = troupe::ActorRef<BlobMember>::connect(loop, address.c_str(), "member");
  ref.call([](BlobMember::Client c) { return c.resetPeakRequest().send(); }).wait(loop.waitScope());
}

// Sends and waits; returns the seconds it took, or a negative number after failing the
// benchmark when a member did not get it.
double sendAndCheck(benchmark::State& state, troupe::EventLoop& loop,
                    kj::ArrayPtr<const troupe::BlobTarget> targets, uint64_t version,
                    kj::ArrayPtr<const kj::byte> bytes, troupe::BlobSendOptions options) {
  auto start = Clock::now();
  auto results = troupe::sendBlob(loop, targets, "weights", version, borrowed(bytes), options)
                     .waitAll(600 * kj::SECONDS)
                     .wait(loop.waitScope());
  double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  for (auto& r : results) {
    KJ_IF_MAYBE(e, r.error) {
      state.SkipWithError(e->getDescription().cStr());
      return -1;
    }
  }
  return seconds;
}

// ---------------------------------------------------------------------------------------------
// Loopback

// A unix socket path of its own for the `i`th same-host member of this process.
std::string socketPath(int i) {
  return "/tmp/troupe-blob-bench-" + std::to_string(getpid()) + "-" + std::to_string(i) + ".sock";
}

// One transfer to each of `members` members listening on `listen(i)`, `fanout` among them.
// Args: MiB, and chunk KiB and window KiB (0: BlobSendOptions' defaults). `reads`:
// BlobSendOptions::sameHostReads.
template <typename Listen>
void sendToMembers(benchmark::State& state, size_t members, Listen listen, troupe::Fanout fanout,
                   bool reads = true) {
  uint64_t size = state.range(0) * MiB;
  troupe::BlobSendOptions options{.fanout = fanout, .sameHostReads = reads};
  if (state.range(1) > 0) options.chunkBytes = state.range(1) << 10;
  if (state.range(2) > 0) options.windowBytes = state.range(2) << 10;
  auto bytes = payload(size);
  std::vector<std::unique_ptr<MemberProcess>> processes;
  std::vector<troupe::BlobTarget> targets;
  for (size_t i = 0; i < members; ++i) {
    processes.push_back(
        std::make_unique<MemberProcess>(std::vector<std::string>{}, listen(i), false));
    targets.push_back({"bench/member-" + std::to_string(i), processes.back()->address});
  }
  troupe::EventLoop loop;
  uint64_t version = 1;
  auto all = kj::arrayPtr(targets.data(), targets.size());
  sendAndCheck(state, loop, all, version++, bytes, options);  // warm-up
  uint64_t senderPeak = 0;
  uint64_t memberPeak = 0;
  for (auto _ : state) {
    resetPeak();
    for (auto& t : targets) resetPeakOf(loop, t.address);
    auto seconds = sendAndCheck(state, loop, all, version++, bytes, options);
    if (seconds < 0) return;
    state.SetIterationTime(seconds);
    senderPeak = std::max(senderPeak, peakResidentBytes());
    for (auto& t : targets) memberPeak = std::max(memberPeak, statsOf(loop, t.address).peak);
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * size));
  state.counters["sender_extra_mib"] = (double(senderPeak) - double(size)) / MiB;
  state.counters["member_extra_mib"] = (double(memberPeak) - double(size)) / MiB;
}

void BM_Blob_Loopback(benchmark::State& state) {
  sendToMembers(
      state, 1, [](int) { return std::string("tcp://127.0.0.1:0"); }, troupe::Fanout::STAR);
}

// The same over a unix socket: the member reads the chunks out of the sender's memory (README,
// "Same host").
void BM_Blob_SameHost(benchmark::State& state) {
  sendToMembers(
      state, 1, [](int i) { return "unix:" + socketPath(i); }, troupe::Fanout::STAR);
}

// The same with BlobSendOptions::sameHostReads off: the chunks go through the connection's
// shared memory.
void BM_Blob_SameHostShared(benchmark::State& state) {
  sendToMembers(
      state, 1, [](int i) { return "unix:" + socketPath(i); }, troupe::Fanout::STAR, false);
}

// A chain through `state.range(3)` members on this host, each hop over a unix socket.
void BM_Blob_SameHostChain(benchmark::State& state) {
  sendToMembers(
      state, state.range(3), [](int i) { return "unix:" + socketPath(i); }, troupe::Fanout::CHAIN);
}

// The same through shared memory (sameHostReads off).
void BM_Blob_SameHostChainShared(benchmark::State& state) {
  sendToMembers(
      state, state.range(3), [](int i) { return "unix:" + socketPath(i); }, troupe::Fanout::CHAIN,
      false);
}

// Times `copy(into)`, which writes `size` bytes to `into` and says whether it could, once an
// iteration: into memory touched once up front, or (`fresh`) into a fresh blob each time
// (allocateBlobMemory(), its page faults timed with the copy).
template <typename Copy>
void timeCopies(benchmark::State& state, uint64_t size, bool fresh, Copy&& copy) {
  auto warm = kj::heapArray<kj::byte>(fresh ? 0 : size);
  memset(warm.begin(), 0, warm.size());
  for (auto _ : state) {
    auto start = Clock::now();
    auto memory = fresh ? troupe::allocateBlobMemory(size) : kj::Array<kj::byte>(nullptr);
    auto* into = fresh ? memory.begin() : warm.begin();
    if (!copy(into)) break;
    benchmark::DoNotOptimize(into);
    state.SetIterationTime(std::chrono::duration<double>(Clock::now() - start).count());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * size));
}

// One core's memcpy of the payload into memory already touched: the bound for a copy.
void BM_Memcpy(benchmark::State& state) {
  uint64_t size = state.range(0) * MiB;
  auto bytes = payload(size);
  timeCopies(state, size, false, [&](kj::byte* into) {
    memcpy(into, bytes.begin(), size);
    return true;
  });
}

// What a receiver does with each chunk that came in a message rather than read into place (the
// same-host path's, from shared memory): check it and copy it into the blob, 4 MiB at a time
// from memory not in any cache. Arg 0: checksum, then memcpy (as receivers did up to commit
// 1b09cfe); arg 1: copyWithChecksum(), one pass.
void BM_ChunkCheckAndCopy(benchmark::State& state) {
  constexpr uint64_t size = uint64_t{1} << 30;
  constexpr uint64_t chunk = 4 * MiB;
  auto bytes = payload(size);
  auto into = kj::heapArray<kj::byte>(size);
  memset(into.begin(), 0, size);
  uint64_t sums = 0;
  for (auto _ : state) {
    auto start = Clock::now();
    for (uint64_t at = 0; at < size; at += chunk) {
      auto from = bytes.slice(at, at + chunk);
      if (state.range(0) == 0) {
        sums += troupe::actor_detail::blobChecksum(from);
        memcpy(into.begin() + at, from.begin(), chunk);
      } else {
        sums += troupe::actor_detail::copyWithChecksum(into.begin() + at, from);
      }
    }
    benchmark::DoNotOptimize(sums);
    benchmark::DoNotOptimize(into.begin());
    state.SetIterationTime(std::chrono::duration<double>(Clock::now() - start).count());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * size));
}

// A fresh blob's memory written once, page by page, as a receiver fills it: from the heap (arg
// 0) or allocateBlobMemory() (arg 1, huge pages where the kernel gives them). The page faults
// are the difference.
void BM_BlobMemory_FirstWrite(benchmark::State& state) {
  constexpr uint64_t size = uint64_t{1} << 30;
  for (auto _ : state) {
    auto start = Clock::now();
    auto memory = state.range(0) == 0 ? kj::heapArray<kj::byte>(size)
                                      : troupe::allocateBlobMemory(size);
    for (uint64_t at = 0; at < size; at += 4096) memory[at] = 1;
    benchmark::DoNotOptimize(memory.begin());
    state.SetIterationTime(std::chrono::duration<double>(Clock::now() - start).count());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * size));
}

// The floor of any same-host receiver that copies a 1 GiB blob once into a fresh blob
// (allocateBlobMemory()): its page faults, then one core's memcpy. No transport, however it moves
// the bytes, can deliver a copy into fresh memory faster.
void BM_FreshBlobCopy(benchmark::State& state) {
  constexpr uint64_t size = uint64_t{1} << 30;
  auto bytes = payload(size);
  timeCopies(state, size, true, [&](kj::byte* into) {
    memcpy(into, bytes.begin(), size);
    return true;
  });
}

// The kernel's own one-copy path between processes: this process reads a 1 GiB payload out of
// another's memory (a child holding it) with process_vm_readv(), 4 MiB at a time, into memory
// already touched (arg 0) or into a fresh blob (arg 1, allocateBlobMemory()). What a receiver
// pulling from its sender's memory would get, with no work at all on the sender's side.
void BM_ProcessVmReadv(benchmark::State& state) {
  constexpr uint64_t size = uint64_t{1} << 30;
  constexpr uint64_t step = 4 * MiB;
  auto bytes = payload(size);
  int ready[2];
  KJ_SYSCALL(pipe(ready));
  pid_t child = fork();
  KJ_REQUIRE(child >= 0, "fork failed");
  if (child == 0) {
    // A copy of its own (not pages shared with the parent until written), and where it is.
    auto own = kj::heapArray<kj::byte>(bytes);
    close(ready[0]);
    auto* at = own.begin();
    if (write(ready[1], &at, sizeof(at)) != sizeof(at)) _exit(1);
    pause();
    _exit(0);
  }
  close(ready[1]);
  kj::byte* from = nullptr;
  KJ_REQUIRE(read(ready[0], &from, sizeof(from)) == sizeof(from),
             "the child holding the payload did not start");
  close(ready[0]);
  timeCopies(state, size, state.range(0) != 0, [&](kj::byte* into) {
    for (uint64_t at = 0; at < size; at += step) {
      struct iovec local = {into + at, step};
      struct iovec remote = {from + at, step};
      if (process_vm_readv(child, &local, 1, &remote, 1, 0) != static_cast<ssize_t>(step)) {
        state.SkipWithError(kj::str("process_vm_readv: ", strerror(errno)).cStr());
        return false;
      }
    }
    return true;
  });
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
}

// The one copy a user-space same-host path would make were the sender's blob in shared memory
// from the start (a memfd's pages, as another process sees them): each iteration maps the 1 GiB
// afresh (MAP_POPULATE) and copies it into memory already touched (arg 0) or into a fresh blob
// (arg 1, allocateBlobMemory()). troupe has no such path: a sender's blob is its user's memory.
void BM_SharedMappingCopy(benchmark::State& state) {
  constexpr uint64_t size = uint64_t{1} << 30;
  int fd = memfd_create("troupe-bench", MFD_CLOEXEC);
  KJ_REQUIRE(fd >= 0, "memfd_create failed");
  KJ_SYSCALL(ftruncate(fd, size));
  {
    auto* filling = static_cast<kj::byte*>(
        mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
    KJ_REQUIRE(filling != MAP_FAILED, "mmap failed");
    auto bytes = payload(size);
    memcpy(filling, bytes.begin(), size);
    munmap(filling, size);
  }
  timeCopies(state, size, state.range(0) != 0, [&](kj::byte* into) {
    auto* from = mmap(nullptr, size, PROT_READ, MAP_SHARED | MAP_POPULATE, fd, 0);
    KJ_REQUIRE(from != MAP_FAILED, "mmap failed");
    memcpy(into, from, size);
    munmap(from, size);
    return true;
  });
  close(fd);
}

void writeAll(int fd, const void* data, uint64_t n) {
  auto* at = static_cast<const char*>(data);
  while (n > 0) {
    auto sent = write(fd, at, std::min<uint64_t>(n, 1 << 30));
    KJ_REQUIRE(sent > 0, "raw write failed");
    at += sent;
    n -= sent;
  }
}

void BM_RawTcp_Loopback(benchmark::State& state) {
  uint64_t size = state.range(0) * MiB;
  auto bytes = payload(size);
  MemberProcess member({}, "tcp://127.0.0.1:0", true);
  int fd = troupe::bench::connectTcp(member.rawAddress);
  auto once = [&]() {
    auto start = Clock::now();
    writeAll(fd, &size, sizeof(size));
    writeAll(fd, bytes.begin(), size);
    char ok = 0;
    KJ_REQUIRE(read(fd, &ok, 1) == 1, "no answer from the raw sink");
    return std::chrono::duration<double>(Clock::now() - start).count();
  };
  once();  // warm-up: the sink's buffer
  for (auto _ : state) state.SetIterationTime(once());
  close(fd);
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * size));
}

// ---------------------------------------------------------------------------------------------
// The simulated network: host 0 sends, hosts 1..8 are members.

struct Network {
  Network() : net(NET_MEMBERS + 1, linkRate()), previous(-1) {
    for (int i = 1; i <= NET_MEMBERS; ++i) {
      members.push_back(std::make_unique<MemberProcess>(
          std::vector<std::string>{"/usr/sbin/ip", "netns", "exec", net.ns(i)},
          "tcp://" + troupe::bench::SimulatedNetwork::ip(i) + ":0", false));
    }
  }
  static std::string linkRate() {
    const char* rate = getenv("TROUPE_BENCH_LINK");
    return rate != nullptr ? rate : "2gbit";
  }
  kj::Array<troupe::BlobTarget> targets(size_t n) {
    return KJ_MAP(i, kj::range<size_t>(0, n)) {
      return troupe::BlobTarget{"bench/member-" + std::to_string(i), members[i]->address};
    };
  }
  troupe::bench::SimulatedNetwork net;
  std::vector<std::unique_ptr<MemberProcess>> members;
  int previous;
};

std::unique_ptr<Network> network;

void stopNetwork(int) {
  network = nullptr;
  _exit(1);
}

Network* theNetwork(benchmark::State& state) {
  if (!troupe::bench::SimulatedNetwork::available()) {
    state.SkipWithError("the simulated network needs root, ip and tc");
    return nullptr;
  }
  if (network == nullptr) {
    signal(SIGINT, stopNetwork);
    signal(SIGTERM, stopNetwork);
    try {
      network = std::make_unique<Network>();
    } catch (const std::exception& e) {
      state.SkipWithError(e.what());
      return nullptr;
    }
  }
  return network.get();
}

// Runs `body` with the calling thread in the sender's namespace.
template <typename Fn>
void asSender(Network& n, Fn&& body) {
  int previous = n.net.enter(0);
  body();
  troupe::bench::SimulatedNetwork::leave(previous);
}

uint64_t netVersion = 1;

void broadcast(benchmark::State& state, size_t members, troupe::Fanout fanout) {
  auto* n = theNetwork(state);
  if (n == nullptr) return;
  auto bytes = payload(NET_BYTES);
  asSender(*n, [&]() {
    troupe::EventLoop loop;
    auto targets = n->targets(members);
    troupe::BlobSendOptions options{.fanout = fanout};
    if (const char* c = getenv("TROUPE_BENCH_CHUNK_KIB")) options.chunkBytes = atoi(c) << 10;
    if (const char* w = getenv("TROUPE_BENCH_WINDOW_KIB")) {
      options.windowBytes = uint64_t(atoi(w)) << 10;
    }
    sendAndCheck(state, loop, targets, netVersion++, bytes, options);  // warm-up
    for (auto _ : state) {
      auto seconds = sendAndCheck(state, loop, targets, netVersion++, bytes, options);
      if (seconds < 0) return;
      state.SetIterationTime(seconds);
    }
  });
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * NET_BYTES));
}

void BM_Net_Single(benchmark::State& state) { broadcast(state, 1, troupe::Fanout::STAR); }

void BM_Net_Broadcast(benchmark::State& state) {
  broadcast(state, NET_MEMBERS, static_cast<troupe::Fanout>(state.range(0)));
  static const char* names[] = {"STAR", "CHAIN", "TREE"};
  state.SetLabel(names[state.range(0)]);
}

// The sender serves the blob; each member fetches it with one ordinary call.
class SourceImpl final : public BlobSource::Server {
public:
  explicit SourceImpl(kj::ArrayPtr<const kj::byte> bytes) : bytes(bytes) {}

protected:
  kj::Promise<void> fetch(FetchContext context) override {
    auto results = context.getResults();
    troupe::adoptBytes(results, &BlobSource::FetchResults::Builder::adoptData, borrowed(bytes));
    return kj::READY_NOW;
  }

private:
  kj::ArrayPtr<const kj::byte> bytes;
};

void BM_Net_Pull(benchmark::State& state) {
  auto* n = theNetwork(state);
  if (n == nullptr) return;
  auto bytes = payload(NET_BYTES);
  asSender(*n, [&]() {
    troupe::EventLoop loop;
    troupe::JobContext job;
    job.jobId = "bench";
    troupe::ActorServer source(loop, job);
    source.host<BlobSource>("source", kj::heap<SourceImpl>(bytes));
    auto listen = "tcp://" + troupe::bench::SimulatedNetwork::ip(0) + ":0";
    auto address = source.listen(listen.c_str());
    std::vector<troupe::ActorRef<BlobMember>> refs;
    for (auto& m : n->members) {
      refs.push_back(troupe::ActorRef<BlobMember>::connect(loop, m->address.c_str(), "member"));
    }
    for (auto _ : state) {
      auto start = Clock::now();
      auto pulls = KJ_MAP(ref, refs) {
        return ref.call(
            [&](BlobMember::Client c) {
              auto r = c.pullRequest();
              r.setAddress(address);
              return r.send();
            },
            {.deadline = 600 * kj::SECONDS});
      };
      auto all = kj::joinPromises(kj::mv(pulls)).wait(loop.waitScope());
      state.SetIterationTime(std::chrono::duration<double>(Clock::now() - start).count());
      for (auto& r : all) {
        if (r.getBytes() != NET_BYTES) state.SkipWithError("a member pulled the wrong size");
      }
    }
  });
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * NET_BYTES));
}

BENCHMARK(BM_Memcpy)->Arg(1024)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_BlobMemory_FirstWrite)->Arg(0)->Arg(1)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_FreshBlobCopy)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_ProcessVmReadv)->Arg(0)->Arg(1)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_SharedMappingCopy)->Arg(0)->Arg(1)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_ChunkCheckAndCopy)->Arg(0)->Arg(1)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_RawTcp_Loopback)->Arg(1024)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Blob_SameHost)->Args({1024, 0, 0})->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Blob_SameHostShared)
    ->Args({1024, 0, 0})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Blob_SameHostChain)
    ->Args({1024, 0, 0, 4})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Blob_SameHostChainShared)
    ->Args({1024, 0, 0, 4})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Blob_Loopback)
    ->Args({1024, 0, 0})
    ->ArgsProduct({{1024}, {1024, 4096}, {8192, 65536}})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
// 4 GiB: offsets past 32 bits, and memory at that size (run on its own: --benchmark_filter=Huge).
void BM_Blob_Huge(benchmark::State& state) { BM_Blob_Loopback(state); }
BENCHMARK(BM_Blob_Huge)
    ->Args({4096, 0, 0})
    ->Iterations(3)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Net_Single)->Iterations(3)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Net_Broadcast)
    ->DenseRange(0, 2)
    ->Iterations(3)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Net_Pull)->Iterations(3)->UseManualTime()->Unit(benchmark::kMillisecond);

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  network = nullptr;
  return 0;
}
