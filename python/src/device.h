#pragma once
// GPU memory in the Python module: troupe.DeviceArray (device memory troupe allocated, with
// __cuda_array_interface__), troupe.cuda_runtime(), and the device memory of objects that
// export it (a CUDA tensor), for blobs sent from and received into a GPU.

#include <string>

#include <kj/array.h>
#include <pybind11/pybind11.h>

namespace troupe::python {

// An object's bytes in GPU memory.
struct DeviceBytes {
  kj::Array<const kj::byte> bytes;  // device memory, holding the object
  int device = 0;                   // its CUDA device
};

// The bytes of `object` when it exposes GPU memory: `__cuda_array_interface__` over contiguous
// memory, or DLPack (`__dlpack_device__` and `__dlpack__`) on a CUDA device. Null for any other
// object. Raises InvalidArgument naming `what` for one it cannot send (not contiguous, no
// memory), and what CUDA's absence raises. GIL held.
kj::Maybe<DeviceBytes> deviceBytesOf(pybind11::handle object, const std::string& what);

// A read-only troupe.DeviceArray over `bytes`, device memory of CUDA device `device`. GIL held.
pybind11::object deviceArrayOf(kj::Array<const kj::byte> bytes, int device);

void bindDevice(pybind11::module_& m);

}  // namespace troupe::python
