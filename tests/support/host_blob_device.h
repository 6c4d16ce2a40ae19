#pragma once
// A BlobDevice (troupe/actor/blob_device.h) whose "device memory" is host memory the CPU must
// not touch directly, for tests on machines without a GPU. Its addresses are the real ones with
// bit 62 set: not canonical on x86-64 or AArch64, so any read or write through one faults at
// once, as a device pointer would, and only copyIn()/copyOut() reach the bytes. Copies run on
// the loop's thread pool (EventLoop::offload), one after another in the order asked for, as a
// CUDA stream runs them; each checks that its device range lies inside one allocation. It
// exports and opens its own memory for copies device to device, as CUDA IPC does between
// processes.

#include <string.h>
#include <unistd.h>

#include <map>

#include <kj/array.h>
#include <kj/async.h>
#include <kj/debug.h>

#include "troupe/actor/blob_device.h"
#include "troupe/base/errors.h"
#include "troupe/base/event_loop.h"

namespace troupe::test {

class HostBlobDevice final : public BlobDevice, private kj::ArrayDisposer {
public:
  explicit HostBlobDevice(EventLoop& loop) : loop(loop) {}

  kj::StringPtr name() const override { return "host-device"; }

  kj::Array<kj::byte> allocate(size_t bytes) override {
    auto* real = new kj::byte[bytes == 0 ? 1 : bytes];
    live[real] = bytes;
    liveBytes += bytes;
    return kj::Array<kj::byte>(tag(real), bytes, *this);
  }

  kj::Array<kj::byte> allocateStaging(size_t bytes) override {
    ++stagingMade;
    return kj::heapArray<kj::byte>(bytes);
  }

  kj::Promise<void> copyIn(kj::byte* to, const kj::byte* from, size_t bytes) override {
    if (bytesIn + bytes > failCopiesInPast) {
      return after([]() { KJ_FAIL_REQUIRE("the device failed a copy (as the test asked)"); });
    }
    bytesIn += bytes;
    return after([to = untag(to, bytes), from, bytes]() {
      if (bytes != 0) memcpy(to, from, bytes);
    });
  }

  kj::Promise<void> copyOut(kj::byte* to, const kj::byte* from, size_t bytes) override {
    bytesOut += bytes;
    return after([to, from = untag(from, bytes), bytes]() {
      if (bytes != 0) memcpy(to, from, bytes);
    });
  }

  // Device to device, as CUDA IPC does it, within this process only: the handle names the
  // device object and the memory; a device made with `shares` false exports and opens nothing.
  kj::Maybe<kj::Array<kj::byte>> exportMemory(const kj::byte* at, size_t bytes) override {
    if (!shares) return nullptr;
    if (exportFails) throwError(ErrorCode::FAILED, "the test made exports fail");
    untag(at, bytes);  // checks it is ours
    Handle h{getpid(), this, at, bytes};
    auto out = kj::heapArray<kj::byte>(sizeof(h));
    memcpy(out.begin(), &h, sizeof(h));
    ++exports;
    return kj::mv(out);
  }

  kj::Array<const kj::byte> importMemory(kj::ArrayPtr<const kj::byte> handle) override {
    Handle h;
    KJ_REQUIRE(shares, "this device opens no memory of others");
    KJ_REQUIRE(handle.size() == sizeof(h), "not a handle of a host-device");
    memcpy(&h, handle.begin(), sizeof(h));
    KJ_REQUIRE(h.pid == getpid() && h.device == this, "memory of another host-device");
    ++imports;
    return kj::ArrayPtr<const kj::byte>(h.at, h.bytes).attach(kj::defer([this]() { --imports; }));
  }

  kj::Promise<void> copyWithin(kj::byte* to, const kj::byte* from, size_t bytes) override {
    bytesWithin += bytes;
    return after([to = untag(to, bytes), from = untag(from, bytes), bytes]() {
      if (bytes != 0) memcpy(to, from, bytes);
    });
  }

  // The bytes of device memory [at, at + size), copied out now (waits for earlier copies).
  kj::Array<kj::byte> read(kj::WaitScope& ws, const kj::byte* at, size_t size) {
    auto out = kj::heapArray<kj::byte>(size);
    copyOut(out.begin(), at, size).wait(ws);
    return out;
  }

  // Device memory holding a copy of `bytes`, written now.
  kj::Array<kj::byte> upload(kj::WaitScope& ws, kj::ArrayPtr<const kj::byte> bytes) {
    auto at = allocate(bytes.size());
    copyIn(at.begin(), bytes.begin(), bytes.size()).wait(ws);
    return at;
  }

  // Resolves once no device memory is left allocated.
  kj::Promise<void> whenAllFreed() {
    if (liveBytes == 0) return kj::READY_NOW;
    auto paf = kj::newPromiseAndFulfiller<void>();
    freed = kj::mv(paf.fulfiller);
    return kj::mv(paf.promise);
  }

  // Holds every copy asked for from now on until resume(), as a busy copy engine would. (A copy
  // that fails, as failCopiesInPast makes it, fails every later one too, as a CUDA error does.)
  void pause() {
    KJ_REQUIRE(gate == nullptr, "paused already");
    auto paf = kj::newPromiseAndFulfiller<void>();
    gate = kj::mv(paf.fulfiller);
    last = last.addBranch()
               .then([promise = kj::mv(paf.promise)]() mutable { return kj::mv(promise); })
               .fork();
  }
  void resume() {
    KJ_IF_MAYBE(g, gate) {
      (*g)->fulfill();
    }
    gate = nullptr;
  }

  size_t liveBytes = 0;                    // device memory not freed yet
  uint64_t bytesIn = 0;                    // copied into the device
  uint64_t bytesOut = 0;                   // copied out of it
  size_t stagingMade = 0;                  // staging buffers allocated
  uint64_t bytesWithin = 0;                // copied device to device
  size_t exports = 0;                      // handles made
  size_t imports = 0;                      // handles open now
  bool shares = true;                      // exports and opens memory (device to device)
  bool exportFails = false;                // exportMemory() throws
  uint64_t failCopiesInPast = UINT64_MAX;  // copies in that would pass this many bytes fail

private:
  static constexpr uintptr_t TAG = uintptr_t{1} << 62;

  struct Handle {
    pid_t pid;
    const HostBlobDevice* device;
    const kj::byte* at;
    size_t bytes;
  };

  static kj::byte* tag(kj::byte* real) {
    return reinterpret_cast<kj::byte*>(reinterpret_cast<uintptr_t>(real) | TAG);
  }

  // The real address of device range [at, at + bytes), which must lie in one allocation.
  kj::byte* untag(const kj::byte* at, size_t bytes) const {
    auto address = reinterpret_cast<uintptr_t>(at);
    KJ_REQUIRE((address & TAG) != 0, "a host address where device memory was due");
    auto* real = reinterpret_cast<kj::byte*>(address & ~TAG);
    auto next = live.upper_bound(real);
    KJ_REQUIRE(next != live.begin(), "an address outside device memory");
    --next;
    KJ_REQUIRE(real + bytes <= next->first + next->second, "a copy past its allocation's end");
    return real;
  }

  template <typename Copy>
  kj::Promise<void> after(Copy copy) {
    auto done = last.addBranch().then([this, copy]() { return loop.offload(copy); }).fork();
    auto result = done.addBranch();
    last = kj::mv(done);
    return result;
  }

  void disposeImpl(void* first, size_t, size_t count, size_t, void (*)(void*)) const override {
    auto* real = reinterpret_cast<kj::byte*>(reinterpret_cast<uintptr_t>(first) & ~TAG);
    auto& self = const_cast<HostBlobDevice&>(*this);
    self.live.erase(real);
    self.liveBytes -= count;
    delete[] real;
    if (self.liveBytes == 0) {
      KJ_IF_MAYBE(f, self.freed) {
        (*f)->fulfill();
        self.freed = nullptr;
      }
    }
  }

  EventLoop& loop;
  std::map<kj::byte*, size_t> live;  // real address -> size
  kj::Maybe<kj::Own<kj::PromiseFulfiller<void>>> freed;
  kj::Maybe<kj::Own<kj::PromiseFulfiller<void>>> gate;  // pause()'s
  kj::ForkedPromise<void> last = kj::Promise<void>(kj::READY_NOW).fork();
};

}  // namespace troupe::test
