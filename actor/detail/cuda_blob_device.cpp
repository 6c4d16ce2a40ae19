// BlobDevice over a CUDA device (blob_device.h): copies on a stream of its own, each followed by
// a stream callback that tells the loop how it went; page-locked staging buffers kept for reuse.

#include <string.h>

#include <deque>
#include <map>
#include <mutex>
#include <vector>

#include <kj/debug.h>

#include "troupe/actor/blob_device.h"
#include "troupe/actor/detail/cuda_runtime.h"
#include "troupe/base/errors.h"
#include "troupe/base/uv_handle.h"

namespace troupe::actor_detail {

namespace {

// Page-locked host buffers given back, for the next allocateStaging() of the same size: CUDA's
// page-locking costs far more than a copy through the buffer. Keeps at most MAX_KEPT bytes.
class StagingCache {
public:
  explicit StagingCache(const CudaApi& api) : api(api) {}
  ~StagingCache() {
    for (auto& [at, bytes] : kept) api.freeHost(at);
  }

  void* take(size_t bytes) {
    for (size_t i = 0; i < kept.size(); ++i) {
      if (kept[i].second == bytes) {
        void* at = kept[i].first;
        keptBytes -= bytes;
        kept.erase(kept.begin() + i);
        return at;
      }
    }
    void* at = nullptr;
    checkCuda(api, api.hostAlloc(&at, bytes, CUDA_HOST_ALLOC_PORTABLE),
              kj::str("cudaHostAlloc of ", bytes, " bytes"));
    return at;
  }

  void give(void* at, size_t bytes) {
    if (keptBytes + bytes > MAX_KEPT) {
      api.freeHost(at);
      return;
    }
    kept.emplace_back(at, bytes);
    keptBytes += bytes;
  }

private:
  static constexpr size_t MAX_KEPT = size_t{256} << 20;
  const CudaApi& api;
  std::vector<std::pair<void*, size_t>> kept;
  size_t keptBytes = 0;
};

class CudaBlobDevice final : public BlobDevice {
public:
  CudaBlobDevice(EventLoop& loop, const CudaApi& api, int ordinal)
      : api(api),
        ordinal(ordinal),
        name_(kj::str("cuda:", ordinal)),
        cache(std::make_shared<StagingCache>(api)) {
    current();
    checkCuda(api, api.streamCreateWithFlags(&stream, CUDA_STREAM_NON_BLOCKING),
              "cudaStreamCreateWithFlags");
    checkUv("uv_async_init", uv_async_init(loop.uvLoop(), done.get(), [](uv_async_t* h) {
              if (h->data != nullptr) static_cast<CudaBlobDevice*>(h->data)->settle();
            }));
    done.markInitialised();
    done->data = this;
  }

  ~CudaBlobDevice() noexcept(false) {
    // Every copy and its callback finish before the stream and the handle go.
    api.setDevice(ordinal);
    api.streamSynchronize(stream);
    api.streamDestroy(stream);
    done.close();
  }

  kj::StringPtr name() const override { return name_; }

  kj::Array<kj::byte> allocate(size_t bytes) override { return allocateCudaMemory(ordinal, bytes); }

  kj::Array<kj::byte> allocateStaging(size_t bytes) override {
    current();
    size_t size = bytes == 0 ? 1 : bytes;
    void* at = cache->take(size);
    return kj::ArrayPtr<kj::byte>(static_cast<kj::byte*>(at), bytes)
        .attach(kj::defer([cache = cache, at, size]() { cache->give(at, size); }));
  }

  kj::Promise<void> copyIn(kj::byte* to, const kj::byte* from, size_t bytes) override {
    return copy(to, from, bytes, CUDA_MEMCPY_HOST_TO_DEVICE);
  }

  kj::Promise<void> copyOut(kj::byte* to, const kj::byte* from, size_t bytes) override {
    return copy(to, from, bytes, CUDA_MEMCPY_DEVICE_TO_HOST);
  }

  kj::Maybe<kj::Array<kj::byte>> exportMemory(const kj::byte* at, size_t bytes) override {
    // CUDA exports whole allocations: the handle says where in its allocation `at` is, which
    // only the driver can tell.
    if (api.memGetAddressRange == nullptr) {
      throwError(ErrorCode::UNIMPLEMENTED,
                 "the CUDA driver's cuMemGetAddressRange_v2 was not found (libcuda.so.1 is "
                 "not loaded, or lacks it)");
    }
    current();
    auto address = reinterpret_cast<uintptr_t>(at);
    uintptr_t base = 0;
    size_t size = 0;
    int found = api.memGetAddressRange(&base, &size, address);
    if (found != 0) {
      throwError(ErrorCode::INVALID_ARGUMENT,
                 kj::str("cuMemGetAddressRange_v2 finds no allocation of ", name_,
                         " holding the memory (CUresult ", found, ")"));
    }
    if (address + bytes > base + size) {
      throwError(ErrorCode::INVALID_ARGUMENT,
                 kj::str("the memory runs past the end of its allocation on ", name_));
    }
    IpcHandle h{};
    memcpy(h.tag, IPC_TAG, sizeof(h.tag));
    checkCuda(api, api.ipcGetMemHandle(&h.handle, reinterpret_cast<void*>(base)),
              "cudaIpcGetMemHandle");
    h.offset = address - base;
    h.bytes = bytes;
    auto out = kj::heapArray<kj::byte>(sizeof(h));
    memcpy(out.begin(), &h, sizeof(h));
    return kj::mv(out);
  }

  kj::Array<const kj::byte> importMemory(kj::ArrayPtr<const kj::byte> handle) override {
    IpcHandle h;
    if (handle.size() != sizeof(h) || memcmp(handle.begin(), IPC_TAG, sizeof(h.tag)) != 0) {
      throwError(ErrorCode::INVALID_ARGUMENT, "not a CUDA memory handle of troupe's");
    }
    memcpy(&h, handle.begin(), sizeof(h));
    current();
    void* base = nullptr;
    checkCuda(api, api.ipcOpenMemHandle(&base, h.handle, CUDA_IPC_MEM_LAZY_ENABLE_PEER_ACCESS),
              "cudaIpcOpenMemHandle");
    auto* close = api.ipcCloseMemHandle;
    // The peer says where in the allocation the memory is: copies must stay inside it.
    uintptr_t start = 0;
    size_t size = 0;
    if (api.memGetAddressRange == nullptr ||
        api.memGetAddressRange(&start, &size, reinterpret_cast<uintptr_t>(base)) != 0 ||
        h.offset > size || h.bytes > size - h.offset) {
      close(base);
      throwError(ErrorCode::INVALID_ARGUMENT,
                 kj::str("a memory handle whose bytes lie outside the memory it opens"));
    }
    return kj::ArrayPtr<const kj::byte>(static_cast<const kj::byte*>(base) + h.offset, h.bytes)
        .attach(kj::defer([close, base]() { close(base); }));
  }

  kj::Promise<void> copyWithin(kj::byte* to, const kj::byte* from, size_t bytes) override {
    return copy(to, from, bytes, CUDA_MEMCPY_DEVICE_TO_DEVICE);
  }

private:
  // What exportMemory() hands out: CUDA's handle of the allocation, and where the memory is in
  // it.
  struct IpcHandle {
    char tag[16];
    CudaIpcMemHandle handle;
    uint64_t offset;
    uint64_t bytes;
  };
  static constexpr char IPC_TAG[16] = "troupe-cudaipc1";

  void current() {
    checkCuda(api, api.setDevice(ordinal), kj::str("cudaSetDevice(", ordinal, ")"));
  }

  kj::Promise<void> copy(kj::byte* to, const kj::byte* from, size_t bytes, int kind) {
    current();
    checkCuda(api, api.memcpyAsync(to, from, bytes, kind, stream),
              kj::str("cudaMemcpyAsync of ", bytes, " bytes on ", name_));
    CudaError added = api.streamAddCallback(stream, &copied, this, 0);
    if (added != 0) {
      // The copy is queued: the memory it touches must outlive it, whatever the caller does
      // with the error.
      api.streamSynchronize(stream);
      checkCuda(api, added, "cudaStreamAddCallback");
    }
    auto paf = kj::newPromiseAndFulfiller<void>();
    waiting.push_back(kj::mv(paf.fulfiller));
    return kj::mv(paf.promise);
  }

  // On CUDA's thread, once a copy is done or failed: records how it went and wakes the loop.
  // Calls no CUDA function.
  static void copied(CudaStream, CudaError status, void* data) {
    auto* self = static_cast<CudaBlobDevice*>(data);
    {
      std::lock_guard<std::mutex> lock(self->mutex);
      self->outcomes.push_back(status);
    }
    uv_async_send(self->done.get());
  }

  // On the loop: settles the copies done, which finish in the order they were made.
  void settle() {
    std::deque<CudaError> now;
    {
      std::lock_guard<std::mutex> lock(mutex);
      now.swap(outcomes);
    }
    for (auto status : now) {
      if (waiting.empty()) break;
      auto fulfiller = kj::mv(waiting.front());
      waiting.pop_front();
      if (status == 0) {
        fulfiller->fulfill();
      } else {
        fulfiller->reject(makeError(ErrorCode::FAILED, kj::str("a copy on ", name_, " failed: ",
                                                               api.getErrorString(status))));
      }
    }
  }

  const CudaApi& api;
  const int ordinal;
  const kj::String name_;
  std::shared_ptr<StagingCache> cache;
  CudaStream stream = nullptr;
  UvHandle<uv_async_t> done;
  std::mutex mutex;                // guards `outcomes`, which CUDA's thread adds to
  std::deque<CudaError> outcomes;  // of copies done, not settled yet
  std::deque<kj::Own<kj::PromiseFulfiller<void>>> waiting;
};

// A loop's CUDA devices, one per ordinal, made as first asked for.
class CudaDevices final : public EventLoop::Service {
public:
  explicit CudaDevices(EventLoop&) {}
  std::map<int, std::shared_ptr<BlobDevice>> devices;
};

}  // namespace

}  // namespace troupe::actor_detail

namespace troupe {

std::shared_ptr<BlobDevice> cudaBlobDevice(EventLoop& loop, int ordinal) {
  auto& api = actor_detail::requireCudaDevice(ordinal);
  auto& made = loop.service<actor_detail::CudaDevices>().devices[ordinal];
  if (made == nullptr) made = std::make_shared<actor_detail::CudaBlobDevice>(loop, api, ordinal);
  return made;
}

}  // namespace troupe
