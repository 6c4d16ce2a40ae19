// device_bench: blobs into and out of device memory (actor/blob_device.h), beside the device's
// own copies, on one machine, in GB/s.
//
//  * BM_Device_CopyIn/<MiB>: the device's copy of the payload from page-locked host memory into
//    device memory (for CUDA, cudaMemcpyAsync host to device from pinned memory): the floor of
//    receiving into the device.
//  * BM_Device_CopyWithin/<MiB>: device to device within one device (cudaMemcpyAsync device to
//    device): the floor of the same-host path.
//  * BM_Blob_IntoHost/<MiB>: one blob over loopback TCP from host memory into a member's host
//    memory (bench_blob_member), the reference for the next.
//  * BM_Blob_IntoDevice/<MiB>: the same blob into the member's device memory (target: within
//    1.15x of IntoHost's time).
//  * BM_Blob_DeviceToDevice/<MiB>/<chunk MiB>: from the sender's device memory into the
//    member's, over the member's unix socket: the member copies device to device from the
//    sender's memory (CUDA IPC; target: at least 0.5x CopyWithin), one copy per chunk as the
//    sender says it is in place. With the default 4 MiB chunks, and with 64 MiB chunks (and a
//    256 MiB window): what the per-chunk exchange costs beside the copies.
//
// Each blob benchmark's `pulled` counter is the share of the bytes the member copied straight
// from the sender's memory (BlobResult::pulledBytes): 1 where DeviceToDevice went device to
// device, 0 where it went through staging buffers (the logs say why).
//
//   build/bin/device_bench --benchmark_repetitions=3 --benchmark_report_aggregates_only=true
//   TROUPE_BENCH_DEVICE=host build/bin/device_bench    # host memory standing in for a device
//
// TROUPE_BENCH_DEVICE picks the device: cuda:N, or host (tests/support/host_blob_device.h: copies
// are memcpy on the loop's thread pool, and there is no device to device between processes, so
// DeviceToDevice goes through staging buffers). Default: cuda:0 where CUDA finds a device, else
// host. Each iteration sends a new version; times are wall-clock from the send to the member's
// result (manual time). TROUPE_BENCH_BLOB_MEMBER names bench_blob_member where it is not where the
// build put it (scripts/gpu_check.sh moves both to a GPU machine).

#include <signal.h>
#include <string.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <benchmark/benchmark.h>
#include <kj/debug.h>

#include "troupe/actor/blob.h"
#include "troupe/actor/blob_device.h"
#include "bench/bench_blobs.h"
#include "tests/support/child_process.h"

namespace {

using troupe::bench::borrowed;
using troupe::bench::payload;
using Clock = std::chrono::steady_clock;
constexpr uint64_t MiB = 1 << 20;

// The device TROUPE_BENCH_DEVICE names, as bench_blob_member's --device takes it.
std::string deviceName() {
  const char* chosen = getenv("TROUPE_BENCH_DEVICE");
  if (chosen != nullptr && *chosen != '\0') return chosen;
  return troupe::cudaRuntime().available ? "cuda:0" : "host";
}

std::shared_ptr<troupe::BlobDevice> openDevice(troupe::EventLoop& loop) {
  return troupe::bench::deviceNamed(loop, deviceName());
}

// A bench_blob_member child, listening on `listen`, receiving into `device` ("": host memory).
struct MemberProcess {
  MemberProcess(const std::string& listen, const std::string& device) {
    std::vector<std::string> args = {"--listen", listen};
    if (!device.empty()) {
      args.push_back("--device");
      args.push_back(device);
    }
    const char* program = getenv("TROUPE_BENCH_BLOB_MEMBER");  // where it was moved, if it was
    if (program == nullptr || *program == '\0') program = BENCH_BLOB_MEMBER_PATH;
    process = std::make_unique<troupe::test::ChildProcess>(program, args);
    auto line = process->readLine(60000);
    KJ_REQUIRE(line.rfind("LISTENING ", 0) == 0, "the member did not start", line);
    address = line.substr(strlen("LISTENING "));
  }
  ~MemberProcess() {
    process->kill(SIGTERM);
    process->wait(10000);
  }
  std::unique_ptr<troupe::test::ChildProcess> process;
  std::string address;
};

// Times `copy` (one copy of `size` bytes) per iteration.
template <typename Copy>
void timeCopies(benchmark::State& state, troupe::EventLoop& loop, uint64_t size, Copy copy) {
  copy().wait(loop.waitScope());  // warm-up: first touch of every page
  for (auto _ : state) {
    auto start = Clock::now();
    copy().wait(loop.waitScope());
    state.SetIterationTime(std::chrono::duration<double>(Clock::now() - start).count());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * size));
  state.SetLabel(deviceName());
}

void BM_Device_CopyIn(benchmark::State& state) {
  uint64_t size = state.range(0) * MiB;
  troupe::EventLoop loop;
  auto device = openDevice(loop);
  auto staged = device->allocateStaging(size);
  memcpy(staged.begin(), payload(size).begin(), size);
  auto memory = device->allocate(size);
  timeCopies(state, loop, size,
             [&]() { return device->copyIn(memory.begin(), staged.begin(), size); });
}

void BM_Device_CopyWithin(benchmark::State& state) {
  uint64_t size = state.range(0) * MiB;
  troupe::EventLoop loop;
  auto device = openDevice(loop);
  auto from = device->allocate(size);
  auto to = device->allocate(size);
  device->copyIn(from.begin(), payload(size).begin(), size).wait(loop.waitScope());
  timeCopies(state, loop, size,
             [&]() { return device->copyWithin(to.begin(), from.begin(), size); });
}

// One blob of state.range(0) MiB per iteration to one member listening on `listen`, receiving
// into `memberDevice` ("": host memory), sent from the bench's device memory when `fromDevice`,
// in chunks of `chunkBytes` (0: the default).
void sendBlobs(benchmark::State& state, const std::string& listen, const std::string& memberDevice,
               bool fromDevice, uint32_t chunkBytes = 0) {
  uint64_t size = state.range(0) * MiB;
  MemberProcess member(listen, memberDevice);
  troupe::EventLoop loop;
  std::shared_ptr<troupe::BlobDevice> device;
  kj::Array<kj::byte> onDevice;
  if (fromDevice) {
    device = openDevice(loop);
    onDevice = device->allocate(size);
    device->copyIn(onDevice.begin(), payload(size).begin(), size).wait(loop.waitScope());
  }
  troupe::BlobTarget targets[] = {{"bench/member-0", member.address}};
  uint64_t version = 1;
  uint64_t pulled = 0;  // by the last blob
  auto send = [&]() {
    troupe::BlobSendOptions options;
    options.device = device;
    if (chunkBytes != 0) {
      options.chunkBytes = chunkBytes;
      options.windowBytes = std::max<uint64_t>(options.windowBytes, uint64_t{4} * chunkBytes);
    }
    auto bytes = fromDevice ? borrowed(onDevice) : borrowed(payload(size));
    auto start = Clock::now();
    auto results = troupe::sendBlob(loop, targets, "weights", version++, kj::mv(bytes), options)
                       .waitAll(600 * kj::SECONDS)
                       .wait(loop.waitScope());
    KJ_IF_MAYBE(e, results[0].error) {
      state.SkipWithError(e->getDescription().cStr());
      return -1.0;
    }
    pulled = results[0].pulledBytes;
    return std::chrono::duration<double>(Clock::now() - start).count();
  };
  if (send() < 0) return;  // warm-up: the member's buffer is made and touched
  for (auto _ : state) {
    double seconds = send();
    if (seconds < 0) return;
    state.SetIterationTime(seconds);
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * size));
  state.counters["pulled"] = static_cast<double>(pulled) / static_cast<double>(size);
  state.SetLabel(memberDevice.empty() ? "host" : memberDevice);
}

void BM_Blob_IntoHost(benchmark::State& state) { sendBlobs(state, "tcp://127.0.0.1:0", "", false); }

void BM_Blob_IntoDevice(benchmark::State& state) {
  sendBlobs(state, "tcp://127.0.0.1:0", deviceName(), false);
}

void BM_Blob_DeviceToDevice(benchmark::State& state) {
  auto path = "/tmp/troupe-device-bench-" + std::to_string(getpid()) + ".sock";
  sendBlobs(state, "unix:" + path, deviceName(), true, static_cast<uint32_t>(state.range(1) * MiB));
  unlink(path.c_str());
}

}  // namespace

BENCHMARK(BM_Device_CopyIn)->Arg(1024)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Device_CopyWithin)->Arg(1024)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Blob_IntoHost)->Arg(1024)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Blob_IntoDevice)->Arg(1024)->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Blob_DeviceToDevice)
    ->Args({1024, 4})
    ->Args({1024, 64})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

BENCHMARK_MAIN();
