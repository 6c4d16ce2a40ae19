// troupe's own declarations of the CUDA entry points it loads (actor/detail/cuda_runtime.h),
// checked against CUDA's headers and runtime where a toolkit is installed (tests/CMakeLists.txt
// builds this only there): troupe builds without CUDA, so nothing else would notice a
// declaration that disagrees with the library it calls until a GPU ran it.
//
// At compile time, each entry point's type, with CUDA's enums and handles reduced to what the
// C calling convention sees (their size, or a pointer), and the constants and the layouts troupe
// reads. At run time, the toolkit's own libcudart: every entry point resolves, and its version is
// the headers'.

#include <cuda.h>
#include <cuda_runtime_api.h>
#include <stddef.h>

#include <string>
#include <type_traits>

#include <gtest/gtest.h>

#include "troupe/actor/detail/cuda_runtime.h"

namespace troupe::actor_detail {
namespace {

// What a type is to the C calling convention: integers and enums are their size, structs passed
// by value their size and alignment, pointers to data a pointer to what they point to (any
// struct or void being opaque), and pointers to functions their signature so reduced.
template <size_t bytes>
struct Word {};
template <size_t bytes, size_t align>
struct Record {};
template <typename T>
struct Pointer {};
struct Opaque {};
template <typename R, typename... A>
struct Function {};

template <typename T, typename = void>
struct Abi {
  using type = T;  // void, floating point
};
template <typename T>
using AbiOf = typename Abi<std::remove_cv_t<T>>::type;

template <typename T>
struct Abi<T, std::enable_if_t<std::is_integral_v<T> || std::is_enum_v<T>>> {
  using type = Word<sizeof(T)>;
};
template <typename T>
struct Abi<T, std::enable_if_t<std::is_class_v<T>>> {
  using type = Record<sizeof(T), alignof(T)>;
};
template <typename T>
struct Abi<T*, std::enable_if_t<std::is_class_v<T> || std::is_void_v<T>>> {
  using type = Pointer<Opaque>;
};
template <typename T>
struct Abi<T*,
           std::enable_if_t<!std::is_class_v<T> && !std::is_void_v<T> && !std::is_function_v<T>>> {
  using type = Pointer<AbiOf<T>>;
};
template <typename R, typename... A>
struct Abi<R (*)(A...)> {
  using type = Function<AbiOf<R>, AbiOf<A>...>;
};

template <typename Ours, typename Cudas>
constexpr bool SAME_ABI = std::is_same_v<AbiOf<Ours>, AbiOf<Cudas>>;

#define TROUPE_CHECK_ENTRY(field, entry)                                \
  static_assert(SAME_ABI<decltype(CudaApi::field), decltype(&::entry)>, \
                "CudaApi::" #field " is not declared as CUDA declares " #entry)

TROUPE_CHECK_ENTRY(getDeviceCount, cudaGetDeviceCount);
TROUPE_CHECK_ENTRY(runtimeGetVersion, cudaRuntimeGetVersion);
TROUPE_CHECK_ENTRY(getErrorString, cudaGetErrorString);
TROUPE_CHECK_ENTRY(setDevice, cudaSetDevice);
TROUPE_CHECK_ENTRY(malloc, cudaMalloc);
TROUPE_CHECK_ENTRY(free, cudaFree);
TROUPE_CHECK_ENTRY(hostAlloc, cudaHostAlloc);
TROUPE_CHECK_ENTRY(freeHost, cudaFreeHost);
TROUPE_CHECK_ENTRY(streamCreateWithFlags, cudaStreamCreateWithFlags);
TROUPE_CHECK_ENTRY(streamDestroy, cudaStreamDestroy);
TROUPE_CHECK_ENTRY(streamSynchronize, cudaStreamSynchronize);
TROUPE_CHECK_ENTRY(memcpyAsync, cudaMemcpyAsync);
TROUPE_CHECK_ENTRY(memcpy, cudaMemcpy);
TROUPE_CHECK_ENTRY(pointerGetAttributes, cudaPointerGetAttributes);
TROUPE_CHECK_ENTRY(streamAddCallback, cudaStreamAddCallback);
TROUPE_CHECK_ENTRY(ipcGetMemHandle, cudaIpcGetMemHandle);
TROUPE_CHECK_ENTRY(ipcOpenMemHandle, cudaIpcOpenMemHandle);
TROUPE_CHECK_ENTRY(ipcCloseMemHandle, cudaIpcCloseMemHandle);
// cuda.h names the driver's cuMemGetAddressRange_v2 cuMemGetAddressRange: the name troupe looks
// up is the one this declaration is bound to.
TROUPE_CHECK_ENTRY(memGetAddressRange, cuMemGetAddressRange_v2);
#undef TROUPE_CHECK_ENTRY

// troupe looks each entry point up by the name it checks above: a header that renamed one (to
// a _v2, or to a per-thread default stream's variant) would have the check compare troupe's
// declaration with another function's.
#if defined(cudaGetDeviceCount) || defined(cudaRuntimeGetVersion) ||                     \
    defined(cudaGetErrorString) || defined(cudaSetDevice) || defined(cudaMalloc) ||      \
    defined(cudaFree) || defined(cudaHostAlloc) || defined(cudaFreeHost) ||              \
    defined(cudaStreamCreateWithFlags) || defined(cudaStreamDestroy) ||                  \
    defined(cudaStreamSynchronize) || defined(cudaMemcpyAsync) || defined(cudaMemcpy) || \
    defined(cudaPointerGetAttributes) || defined(cudaStreamAddCallback) ||               \
    defined(cudaIpcGetMemHandle) || defined(cudaIpcOpenMemHandle) ||                     \
    defined(cudaIpcCloseMemHandle)
#error "CUDA's headers rename an entry point troupe loads by its plain name"
#endif

// The constants.
static_assert(cudaSuccess == 0);
static_assert(cudaMemcpyHostToDevice == CUDA_MEMCPY_HOST_TO_DEVICE);
static_assert(cudaMemcpyDeviceToHost == CUDA_MEMCPY_DEVICE_TO_HOST);
static_assert(cudaMemcpyDeviceToDevice == CUDA_MEMCPY_DEVICE_TO_DEVICE);
static_assert(cudaMemcpyDefault == CUDA_MEMCPY_DEFAULT);
static_assert(cudaMemoryTypeDevice == CUDA_MEMORY_TYPE_DEVICE);
static_assert(cudaStreamNonBlocking == CUDA_STREAM_NON_BLOCKING);
static_assert(cudaHostAllocPortable == CUDA_HOST_ALLOC_PORTABLE);
static_assert(cudaIpcMemLazyEnablePeerAccess == CUDA_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
static_assert(CUDA_SUCCESS == 0);

// The layouts: a memory handle travels between processes as troupe's copy of it, and
// cudaDeviceOf() reads a cudaPointerAttributes' type and device from a buffer of 512 bytes.
static_assert(sizeof(cudaIpcMemHandle_t) == sizeof(CudaIpcMemHandle));
static_assert(alignof(cudaIpcMemHandle_t) == alignof(CudaIpcMemHandle));
static_assert(offsetof(cudaPointerAttributes, type) == 0);
static_assert(offsetof(cudaPointerAttributes, device) == sizeof(int));
static_assert(sizeof(cudaPointerAttributes) <= 512);
static_assert(alignof(cudaPointerAttributes) <= 8);

TEST(CudaAbiTest, TheToolkitsRuntimeHasEveryEntryPointAtTheHeadersVersion) {
  kj::StringPtr candidates[] = {TROUPE_TEST_CUDART};
  auto loaded = loadCudaRuntime(candidates);
  const auto& info = loaded.info;
  if (!info.available) {
    // Loaded and asked for its devices, with none (no driver or no GPU): said so, and nothing
    // else.
    EXPECT_NE(info.reason.find(kj::str(TROUPE_TEST_CUDART, " is loaded, but it finds no CUDA "
                                                           "device")
                                   .cStr()),
              std::string::npos)
        << info.reason;
  }
  EXPECT_EQ(info.version, CUDART_VERSION) << info.reason;
}

}  // namespace
}  // namespace troupe::actor_detail
