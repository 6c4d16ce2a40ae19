#pragma once
// Blobs that start or end in device memory (a GPU's), which the CPU does not address.
//
// Receiving into a GPU, in a replica:
//
//   auto gpu = troupe::cudaBlobDevice(loop, 0);   // throws UNIMPLEMENTED where CUDA is absent
//   troupe::BlobAcceptOptions options;
//   options.device = gpu;
//   server.acceptBlobs("weights",
//                      [&](const troupe::BlobHeader& h) { return gpu->allocate(h.size); },
//                      [&](troupe::Blob b) { model.swapIn(b.version, kj::mv(b.bytes)); },
//                      kj::mv(options));
//
// Sending from a GPU: BlobSendOptions::device names the device the bytes are on.
//
// How it moves: the network reads and writes host memory, so each chunk passes through a small
// ring of staging buffers in host memory the device copies to and from fastest (pinned): a
// receiver reads a chunk from the socket into a staging buffer, checks its checksum there and
// has the device copy it into place while the next chunks arrive; a sender (or a member
// forwarding the blob) has the device copy chunks out into staging buffers ahead of the network.
// Checksums are computed on the staged bytes, as for host memory. A blob is handed over once its
// last chunk is in device memory.
//
// Device to device on one host: when the sender's bytes are on a device that can export them
// (CUDA IPC) and a member is reached through its same-host socket (README, "Same host"), the
// sender hands it a handle to them; a member whose memory is on a device that can open it copies
// each chunk straight from the sender's device into its own, no byte passing through host
// memory, as the sender says each is in place. A chain of members on one host does the same hop
// by hop. Elsewhere, or where the handle cannot be opened, chunks go through staging buffers.
//
// CUDA is loaded when first asked for (libcudart, found as cudaRuntime() says), so troupe has no
// link-time dependency on it and runs unchanged where it is absent. BlobDevice is an interface:
// anything that can copy between host memory and its own can be one.

#include <stddef.h>
#include <stdint.h>

#include <memory>
#include <string>

#include <kj/array.h>
#include <kj/async.h>

#include "troupe/base/event_loop.h"

namespace troupe {

// Memory that blobs may start and end in, with the copies between it and host memory. Belongs to
// the loop it was made for; every call comes from that loop's thread. Shared (std::shared_ptr)
// by the options and blobs that name it.
class BlobDevice {
public:
  virtual ~BlobDevice() noexcept(false) = default;

  // Names the device in logs and errors ("cuda:0").
  virtual kj::StringPtr name() const = 0;

  // `bytes` of device memory, freed when the array goes. Throws when there is not enough.
  virtual kj::Array<kj::byte> allocate(size_t bytes) = 0;

  // `bytes` of host memory the device copies to and from fastest (for CUDA, page-locked), at
  // least 8-byte aligned: blobs stage chunks through it. Throws when there is not enough.
  virtual kj::Array<kj::byte> allocateStaging(size_t bytes) = 0;

  // Copies `bytes` from host memory at `from` to device memory at `to` (copyIn), or from device
  // memory to host memory (copyOut); resolves once the copy is done. Copies run in the order
  // they were asked for, overlapped with whatever the loop does meanwhile. Both ranges must stay
  // valid until the promise resolves; dropping the promise does not stop the copy.
  virtual kj::Promise<void> copyIn(kj::byte* to, const kj::byte* from, size_t bytes) = 0;
  virtual kj::Promise<void> copyOut(kj::byte* to, const kj::byte* from, size_t bytes) = 0;

  // Device to device on one host (for CUDA, IPC). The default does none of it, and blobs then
  // move through staging buffers as between hosts.
  //
  // Device memory [at, at + bytes) as a handle that another process of this host may open with
  // importMemory() of a device of the same kind. Null where this kind of device exports
  // nothing (the default); throws, saying why, where it cannot export this memory.
  virtual kj::Maybe<kj::Array<kj::byte>> exportMemory(const kj::byte* at, size_t bytes);
  // The memory `handle` names, opened in this process: device memory copyWithin() may read,
  // closed when the array goes. Throws, saying why, where it cannot be opened here (another
  // kind of device, another host, the exporting process itself for CUDA).
  virtual kj::Array<const kj::byte> importMemory(kj::ArrayPtr<const kj::byte> handle);
  // Copies `bytes` from device memory `from` (this device's, or imported) to this device's `to`,
  // in order with the other copies; resolves once done.
  virtual kj::Promise<void> copyWithin(kj::byte* to, const kj::byte* from, size_t bytes);
};

// What this process found of the CUDA runtime. It is looked for once, on first use: in
// $TROUPE_CUDA_RUNTIME if set (a path to libcudart), else libcudart.so.13, .12, .11.0 and
// libcudart.so on the dynamic loader's path. A runtime that finds no device counts as absent.
struct CudaRuntimeInfo {
  bool available = false;
  std::string reason;   // why not, when not available
  std::string library;  // the library loaded
  int version = 0;      // cudaRuntimeGetVersion(): 12040 for 12.4
  int devices = 0;      // cudaGetDeviceCount()
};
const CudaRuntimeInfo& cudaRuntime();

// CUDA device `ordinal` as a BlobDevice for `loop`, one per loop and ordinal (made on the first
// call, kept until the loop goes; drop what you hold of it before): copies run on a CUDA stream
// of its own, and staging buffers are page-locked host memory (cudaHostAlloc), kept for reuse.
// Its allocate() is cudaMalloc's. Throws
// UNIMPLEMENTED, saying why, where CUDA is not available, and INVALID_ARGUMENT for an ordinal
// the machine has not.
std::shared_ptr<BlobDevice> cudaBlobDevice(EventLoop& loop, int ordinal);

// CUDA for code that holds device memory outside a loop (the Python module): any thread. Each
// throws UNIMPLEMENTED, saying why, where CUDA is not available.
//
// `bytes` of CUDA device `ordinal`'s memory (cudaMalloc), freed when the array goes.
kj::Array<kj::byte> allocateCudaMemory(int ordinal, size_t bytes);
// Copies `bytes` between any host and device memory, the direction told by the addresses
// (cudaMemcpy); returns once done.
void copyCudaMemory(void* to, const void* from, size_t bytes);
// The CUDA device whose memory `pointer` is in, or null for any other memory (and where CUDA is
// not available).
kj::Maybe<int> cudaDeviceOf(const void* pointer);
// Waits until the work queued on CUDA stream `stream` of device `ordinal` (a cudaStream_t, or 1
// and 2 for that device's legacy and per-thread default streams, as __cuda_array_interface__
// and DLPack name them) is done.
void synchronizeCudaStream(int ordinal, uintptr_t stream);

}  // namespace troupe
