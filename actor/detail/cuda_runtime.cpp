#include "troupe/actor/detail/cuda_runtime.h"

#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>

#include <memory>

#include <kj/vector.h>

#include "troupe/base/errors.h"

namespace troupe::actor_detail {

namespace {

// Resolves `name` from `library` into `slot`; false, with why in `missing`, when absent.
template <typename F>
bool resolve(void* library, const char* name, F& slot, kj::Vector<kj::String>& missing) {
  void* symbol = dlsym(library, name);
  if (symbol == nullptr) {
    missing.add(kj::str(name));
    return false;
  }
  slot = reinterpret_cast<F>(symbol);
  return true;
}

bool resolveAll(void* library, CudaApi& api, kj::Vector<kj::String>& missing) {
  bool ok = true;
  ok &= resolve(library, "cudaGetDeviceCount", api.getDeviceCount, missing);
  ok &= resolve(library, "cudaRuntimeGetVersion", api.runtimeGetVersion, missing);
  ok &= resolve(library, "cudaGetErrorString", api.getErrorString, missing);
  ok &= resolve(library, "cudaSetDevice", api.setDevice, missing);
  ok &= resolve(library, "cudaMalloc", api.malloc, missing);
  ok &= resolve(library, "cudaFree", api.free, missing);
  ok &= resolve(library, "cudaHostAlloc", api.hostAlloc, missing);
  ok &= resolve(library, "cudaFreeHost", api.freeHost, missing);
  ok &= resolve(library, "cudaStreamCreateWithFlags", api.streamCreateWithFlags, missing);
  ok &= resolve(library, "cudaStreamDestroy", api.streamDestroy, missing);
  ok &= resolve(library, "cudaStreamSynchronize", api.streamSynchronize, missing);
  ok &= resolve(library, "cudaMemcpyAsync", api.memcpyAsync, missing);
  ok &= resolve(library, "cudaStreamAddCallback", api.streamAddCallback, missing);
  ok &= resolve(library, "cudaMemcpy", api.memcpy, missing);
  ok &= resolve(library, "cudaPointerGetAttributes", api.pointerGetAttributes, missing);
  ok &= resolve(library, "cudaIpcGetMemHandle", api.ipcGetMemHandle, missing);
  ok &= resolve(library, "cudaIpcOpenMemHandle", api.ipcOpenMemHandle, missing);
  ok &= resolve(library, "cudaIpcCloseMemHandle", api.ipcCloseMemHandle, missing);
  return ok;
}

}  // namespace

LoadedCuda loadCudaRuntime(kj::ArrayPtr<const kj::StringPtr> candidates) {
  LoadedCuda loaded;
  kj::Vector<kj::String> tried;
  for (auto name : candidates) {
    void* library = dlopen(name.cStr(), RTLD_NOW | RTLD_LOCAL);
    if (library == nullptr) {
      const char* why = dlerror();
      tried.add(kj::str(name, ": ", why == nullptr ? "not loadable" : why));
      continue;
    }
    auto api = std::make_unique<CudaApi>();  // kept on success, as CUDA stays loaded
    kj::Vector<kj::String> missing;
    if (!resolveAll(library, *api, missing)) {
      tried.add(kj::str(name, ": lacks ", kj::strArray(missing, ", ")));
      dlclose(library);
      continue;
    }
    auto& info = loaded.info;
    info.library = name.cStr();
    api->runtimeGetVersion(&info.version);
    CudaError counted = api->getDeviceCount(&info.devices);
    if (counted != 0 || info.devices == 0) {
      // The runtime is here but no device is usable (no driver, no GPU): as good as absent.
      info.reason = kj::str(name, " is loaded, but it finds no CUDA device",
                            counted != 0 ? kj::str(": ", api->getErrorString(counted)) : kj::str())
                        .cStr();
      info.devices = 0;
      return loaded;  // the library stays loaded: unloading CUDA's runtime is not safe
    }
    info.available = true;
    // The runtime has loaded the driver by now; this finds it, where it is, without loading
    // anything new.
    if (void* driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD)) {
      kj::Vector<kj::String> absent;
      if (!resolve(driver, "cuMemGetAddressRange_v2", api->memGetAddressRange, absent)) {
        api->memGetAddressRange = nullptr;
      }
    }
    loaded.api = *api.release();  // for the life of the process
    return loaded;
  }
  loaded.info.reason = kj::str("no CUDA runtime found (", kj::strArray(tried, "; "), ")").cStr();
  return loaded;
}

namespace {

// The process's one CUDA runtime: a library is loaded once per process however many loops use
// it, and unloading CUDA is not safe, so this is the one process-wide state here.
const LoadedCuda& processCuda() {
  static const LoadedCuda loaded = []() {
    const char* chosen = getenv("TROUPE_CUDA_RUNTIME");
    if (chosen != nullptr && *chosen != '\0') {
      kj::StringPtr one[] = {chosen};
      return loadCudaRuntime(one);
    }
    kj::StringPtr defaults[] = {"libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0",
                                "libcudart.so"};
    return loadCudaRuntime(defaults);
  }();
  return loaded;
}

}  // namespace

kj::Maybe<const CudaApi&> cudaApi() { return processCuda().api; }

void checkCuda(const CudaApi& api, CudaError error, kj::StringPtr what) {
  if (error == 0) return;
  throwError(ErrorCode::FAILED,
             kj::str(what, " failed: ", api.getErrorString(error), " (cuda ", error, ")"));
}

}  // namespace troupe::actor_detail

namespace troupe {

const CudaRuntimeInfo& cudaRuntime() { return actor_detail::processCuda().info; }

namespace {

const actor_detail::CudaApi& requireCuda() {
  KJ_IF_MAYBE(api, actor_detail::cudaApi()) {
    return *api;
  }
  throwError(ErrorCode::UNIMPLEMENTED,
             kj::str("CUDA is not available here: ", cudaRuntime().reason));
}

}  // namespace

const actor_detail::CudaApi& actor_detail::requireCudaDevice(int ordinal) {
  auto& api = requireCuda();
  if (ordinal < 0 || ordinal >= cudaRuntime().devices) {
    throwError(ErrorCode::INVALID_ARGUMENT,
               kj::str("no CUDA device ", ordinal, ": this machine has ", cudaRuntime().devices));
  }
  return api;
}

kj::Array<kj::byte> allocateCudaMemory(int ordinal, size_t bytes) {
  auto& api = actor_detail::requireCudaDevice(ordinal);
  actor_detail::checkCuda(api, api.setDevice(ordinal), kj::str("cudaSetDevice(", ordinal, ")"));
  void* at = nullptr;
  actor_detail::checkCuda(api, api.malloc(&at, bytes == 0 ? 1 : bytes),
                          kj::str("cudaMalloc of ", bytes, " bytes on cuda:", ordinal));
  auto* free = api.free;
  return kj::ArrayPtr<kj::byte>(static_cast<kj::byte*>(at), bytes).attach(kj::defer([free, at]() {
    free(at);
  }));
}

void copyCudaMemory(void* to, const void* from, size_t bytes) {
  auto& api = requireCuda();
  actor_detail::checkCuda(api, api.memcpy(to, from, bytes, actor_detail::CUDA_MEMCPY_DEFAULT),
                          kj::str("cudaMemcpy of ", bytes, " bytes"));
}

void synchronizeCudaStream(int ordinal, uintptr_t stream) {
  auto& api = requireCuda();
  // The default streams are the current device's.
  actor_detail::checkCuda(api, api.setDevice(ordinal), kj::str("cudaSetDevice(", ordinal, ")"));
  actor_detail::checkCuda(api, api.streamSynchronize(reinterpret_cast<void*>(stream)),
                          "cudaStreamSynchronize");
}

kj::Maybe<int> cudaDeviceOf(const void* pointer) {
  KJ_IF_MAYBE(api, actor_detail::cudaApi()) {
    alignas(8) char attributes[512] = {};
    if (api->pointerGetAttributes(attributes, pointer) != 0) return nullptr;
    int type = 0;
    int device = 0;
    memcpy(&type, attributes, sizeof(type));
    memcpy(&device, attributes + sizeof(type), sizeof(device));
    if (type != actor_detail::CUDA_MEMORY_TYPE_DEVICE) return nullptr;
    return device;
  }
  return nullptr;
}

}  // namespace troupe
