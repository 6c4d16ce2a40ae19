#pragma once
// The CUDA runtime (libcudart), loaded with dlopen when first asked for: troupe declares the few
// entry points it calls itself (their C ABI has been stable since CUDA 10), so it builds without
// the CUDA toolkit and runs without a GPU.

#include <stddef.h>
#include <stdint.h>

#include <string>

#include <kj/array.h>
#include <kj/common.h>
#include <kj/string.h>

#include "troupe/actor/blob_device.h"

namespace troupe::actor_detail {

// What CUDA calls these (cuda_runtime_api.h, driver_types.h).
using CudaError = int;  // cudaError_t; 0 is cudaSuccess
using CudaStream = void*;
constexpr int CUDA_MEMCPY_HOST_TO_DEVICE = 1;
constexpr int CUDA_MEMCPY_DEVICE_TO_HOST = 2;
constexpr int CUDA_MEMCPY_DEVICE_TO_DEVICE = 3;
constexpr int CUDA_MEMCPY_DEFAULT = 4;  // the direction told by the addresses
constexpr int CUDA_MEMORY_TYPE_DEVICE = 2;
constexpr unsigned CUDA_STREAM_NON_BLOCKING = 1;
constexpr unsigned CUDA_HOST_ALLOC_PORTABLE = 1;

constexpr unsigned CUDA_IPC_MEM_LAZY_ENABLE_PEER_ACCESS = 1;
struct CudaIpcMemHandle {  // cudaIpcMemHandle_t
  char reserved[64];
};

// The entry points, resolved from the library.
struct CudaApi {
  CudaError (*getDeviceCount)(int* count);
  CudaError (*runtimeGetVersion)(int* version);
  const char* (*getErrorString)(CudaError error);
  CudaError (*setDevice)(int device);
  CudaError (*malloc)(void** pointer, size_t bytes);
  CudaError (*free)(void* pointer);
  CudaError (*hostAlloc)(void** pointer, size_t bytes, unsigned flags);
  CudaError (*freeHost)(void* pointer);
  CudaError (*streamCreateWithFlags)(CudaStream* stream, unsigned flags);
  CudaError (*streamDestroy)(CudaStream stream);
  CudaError (*streamSynchronize)(CudaStream stream);
  CudaError (*memcpyAsync)(void* to, const void* from, size_t bytes, int kind, CudaStream stream);
  CudaError (*memcpy)(void* to, const void* from, size_t bytes, int kind);
  // `attributes`: a cudaPointerAttributes, which has grown over releases: its memory type (int)
  // first, then its device (int).
  CudaError (*pointerGetAttributes)(void* attributes, const void* pointer);
  // Runs `callback` on CUDA's thread once the work before it on `stream` is done, or failed
  // (with the error): unlike cudaLaunchHostFunc, also after an error.
  CudaError (*streamAddCallback)(CudaStream stream,
                                 void (*callback)(CudaStream stream, CudaError status, void* data),
                                 void* data, unsigned flags);
  CudaError (*ipcGetMemHandle)(CudaIpcMemHandle* handle, void* pointer);
  CudaError (*ipcOpenMemHandle)(void** pointer, CudaIpcMemHandle handle, unsigned flags);
  CudaError (*ipcCloseMemHandle)(void* pointer);
  // From the driver (libcuda.so.1), where found: the allocation holding a device address, for
  // exporting memory that is not at the start of its allocation. Null where absent.
  int (*memGetAddressRange)(uintptr_t* base, size_t* size, uintptr_t pointer);
};

// A CUDA runtime loaded from one of `candidates` (the first that loads and has every entry
// point), or why none was: the library names tried and what dlopen or dlsym said. Never unloaded.
struct LoadedCuda {
  kj::Maybe<const CudaApi&> api;
  CudaRuntimeInfo info;
};
LoadedCuda loadCudaRuntime(kj::ArrayPtr<const kj::StringPtr> candidates);

// The process's CUDA runtime, loaded once (blob_device.h, cudaRuntime()); null where there is
// none.
kj::Maybe<const CudaApi&> cudaApi();

// The process's CUDA runtime, with `ordinal` one of its devices: throws UNIMPLEMENTED, saying
// why, where there is none, and INVALID_ARGUMENT for a device the machine has not.
const CudaApi& requireCudaDevice(int ordinal);

// Throws FAILED naming `what` and CUDA's description of `error`, unless it is success.
void checkCuda(const CudaApi& api, CudaError error, kj::StringPtr what);

}  // namespace troupe::actor_detail
