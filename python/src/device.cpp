#include "python/src/device.h"

#include <stdint.h>

#include <algorithm>
#include <memory>
#include <vector>

#include <pybind11/stl.h>

#include "troupe/actor/blob_device.h"
#include "troupe/base/errors.h"
#include "python/src/errors.h"
#include "python/src/runtime.h"

namespace py = pybind11;

namespace troupe::python {

namespace {

[[noreturn]] void raiseNoCuda() {
  raise(makeError(ErrorCode::UNIMPLEMENTED,
                  kj::str("CUDA is not available here: ", cudaRuntime().reason)));
}

// Device memory, and the Python object it belongs to when it is not troupe's own (let go of
// with the GIL, as Python wants).
class Held {
public:
  Held(kj::Array<const kj::byte> bytes, py::object owner)
      : bytes_(kj::mv(bytes)), owner(new py::object(kj::mv(owner))) {}
  ~Held() noexcept {
    withGil([owner = owner]() { delete owner; });
  }
  KJ_DISALLOW_COPY(Held);
  kj::ArrayPtr<const kj::byte> bytes() const { return bytes_; }

private:
  kj::Array<const kj::byte> bytes_;
  py::object* owner;
};

// troupe.DeviceArray: bytes in a GPU's memory.
struct DeviceArray {
  std::shared_ptr<Held> memory;
  int device = 0;
  bool readonly = false;

  uintptr_t pointer() const { return reinterpret_cast<uintptr_t>(memory->bytes().begin()); }
  size_t size() const { return memory->bytes().size(); }

  py::dict interface() const {
    py::dict d;
    d["shape"] = py::make_tuple(size());
    d["typestr"] = "|u1";
    d["data"] = py::make_tuple(pointer(), readonly);
    d["strides"] = py::none();
    d["version"] = 3;
    return d;
  }

  py::bytes toBytes() const {
    std::string out(size(), '\0');
    {
      py::gil_scoped_release released;
      copyCudaMemory(out.data(), memory->bytes().begin(), size());
    }
    return py::bytes(out);
  }
};

DeviceArray allocateArray(size_t nbytes, int device) {
  auto bytes = allocateCudaMemory(device, nbytes);
  return DeviceArray{std::make_shared<Held>(kj::mv(bytes), py::none()), device, false};
}

DeviceArray fromBytes(py::buffer data, int device) {
  auto info = data.request();
  if (!PyBuffer_IsContiguous(info.view(), 'C')) raiseInvalidArgument("data must be contiguous");
  size_t size = static_cast<size_t>(info.size * info.itemsize);
  auto array = allocateArray(size, device);
  py::gil_scoped_release released;
  copyCudaMemory(const_cast<kj::byte*>(array.memory->bytes().begin()), info.ptr, size);
  return array;
}

// Bytes per element of a __cuda_array_interface__ typestr ("<f4", "|u1").
size_t itemSize(const std::string& typestr, const std::string& what) {
  if (typestr.size() < 3) raiseInvalidArgument(what + ": a typestr of '" + typestr + "'");
  size_t size = 0;
  for (char c : typestr.substr(2)) {
    if (c < '0' || c > '9') raiseInvalidArgument(what + ": a typestr of '" + typestr + "'");
    size = size * 10 + (c - '0');
  }
  return size;
}

size_t countOf(const std::vector<int64_t>& shape) {
  size_t items = 1;
  for (auto n : shape) items *= static_cast<size_t>(n);
  return items;
}

// Raises InvalidArgument unless `strides` (one per dimension, in units of `unit` bytes) are
// those of a C-ordered array of `shape`: the bytes are sent as one run.
void requireContiguous(const std::vector<int64_t>& shape, const int64_t* strides, int64_t unit,
                       const std::string& what) {
  int64_t expected = unit;
  for (size_t i = shape.size(); i-- > 0;) {
    if (shape[i] != 1 && strides[i] != expected) {
      raiseInvalidArgument(what + " must be contiguous in GPU memory");
    }
    expected *= shape[i];
  }
}

// Waits for the stream a __cuda_array_interface__ names (v3), which may still be writing the
// bytes: troupe's copies run on a stream of their own.
void synchronizeProducer(const py::dict& cai, int device, const std::string& what) {
  if (!cai.contains("stream") || cai["stream"].is_none()) return;
  auto stream = cai["stream"].cast<uintptr_t>();
  if (stream == 0) raiseInvalidArgument(what + ": a __cuda_array_interface__ stream of 0");
  py::gil_scoped_release released;
  synchronizeCudaStream(device, stream);
}

kj::Maybe<DeviceBytes> fromCudaArrayInterface(py::handle object, const std::string& what) {
  auto cai = object.attr("__cuda_array_interface__").cast<py::dict>();
  auto data = cai["data"].cast<py::tuple>();
  auto pointer = data[0].cast<uintptr_t>();
  auto shape = cai["shape"].cast<std::vector<int64_t>>();
  size_t item = itemSize(cai["typestr"].cast<std::string>(), what);
  size_t size = countOf(shape) * item;
  if (cai.contains("strides") && !cai["strides"].is_none()) {
    auto strides = cai["strides"].cast<std::vector<int64_t>>();
    if (strides.size() != shape.size()) raiseInvalidArgument(what + ": strides unlike its shape");
    requireContiguous(shape, strides.data(), static_cast<int64_t>(item), what);
  }
  if (size > 0 && pointer == 0) raiseInvalidArgument(what + " has no memory");
  auto* at = reinterpret_cast<const kj::byte*>(pointer);
  int device = 0;
  if (size == 0) {
    if (!cudaRuntime().available) raiseNoCuda();
  } else KJ_IF_MAYBE(d, cudaDeviceOf(at)) {
    device = *d;
  } else {
    if (!cudaRuntime().available) raiseNoCuda();
    raiseInvalidArgument(what + ": its __cuda_array_interface__ points at no CUDA device's memory");
  }
  synchronizeProducer(cai, device, what);
  auto held = std::make_shared<Held>(kj::Array<const kj::byte>(at, size,
                                                               kj::NullArrayDisposer::instance),
                                     py::reinterpret_borrow<py::object>(object));
  auto bytes = held->bytes();
  return DeviceBytes{kj::ArrayPtr<const kj::byte>(bytes).attach(kj::mv(held)), device};
}

// DLPack's C structures (dlpack.h, the unversioned ones `__dlpack__()` hands out by default).
struct DlDevice {
  int32_t type;  // 2: kDLCUDA
  int32_t id;
};
struct DlDataType {
  uint8_t code;
  uint8_t bits;
  uint16_t lanes;
};
struct DlTensor {
  void* data;
  DlDevice device;
  int32_t ndim;
  DlDataType dtype;
  int64_t* shape;
  int64_t* strides;  // in elements; null: C-contiguous
  uint64_t byteOffset;
};
struct DlManagedTensor {
  DlTensor tensor;
  void* managerContext;
  void (*deleter)(DlManagedTensor* self);
};
constexpr int32_t DLPACK_CUDA = 2;

// An object on a CUDA device through DLPack: its tensor, taken from `__dlpack__()` (which makes
// the bytes ready on the legacy default stream) and given back when the bytes are let go of.
DeviceBytes fromDlpack(py::handle object, const std::string& what) {
  py::object capsule = object.attr("__dlpack__")();
  PyObject* raw = capsule.ptr();
  if (!PyCapsule_IsValid(raw, "dltensor")) {
    raiseInvalidArgument(what + ": its __dlpack__() returned no DLPack tensor");
  }
  auto* managed = static_cast<DlManagedTensor*>(PyCapsule_GetPointer(raw, "dltensor"));
  PyCapsule_SetName(raw, "used_dltensor");  // ours now: its producer no longer frees it
  py::capsule owner(managed, [](void* p) {
    auto* m = static_cast<DlManagedTensor*>(p);
    if (m->deleter != nullptr) m->deleter(m);
  });
  auto& t = managed->tensor;
  if (t.device.type != DLPACK_CUDA) {
    raiseInvalidArgument(what + ": its DLPack tensor is not in a CUDA device's memory");
  }
  if (t.dtype.bits % 8 != 0) raiseInvalidArgument(what + ": elements of a fraction of a byte");
  size_t item = size_t{t.dtype.bits} / 8 * std::max<uint16_t>(t.dtype.lanes, 1);
  std::vector<int64_t> shape(t.shape, t.shape + t.ndim);
  size_t items = countOf(shape);
  if (t.strides != nullptr) requireContiguous(shape, t.strides, 1, what);  // in elements
  auto* at = static_cast<const kj::byte*>(t.data) + t.byteOffset;
  size_t size = items * item;
  if (size > 0 && t.data == nullptr) raiseInvalidArgument(what + " has no memory");
  int device = t.device.id;
  {
    py::gil_scoped_release released;
    synchronizeCudaStream(device, 1);  // the legacy default stream: the producer's, by DLPack
  }
  auto held = std::make_shared<Held>(
      kj::Array<const kj::byte>(at, size, kj::NullArrayDisposer::instance), kj::mv(owner));
  auto bytes = held->bytes();
  return DeviceBytes{kj::ArrayPtr<const kj::byte>(bytes).attach(kj::mv(held)), device};
}

}  // namespace

kj::Maybe<DeviceBytes> deviceBytesOf(py::handle object, const std::string& what) {
  if (py::isinstance<DeviceArray>(object)) {
    auto& array = object.cast<DeviceArray&>();
    auto bytes = array.memory->bytes();
    return DeviceBytes{kj::ArrayPtr<const kj::byte>(bytes).attach(array.memory), array.device};
  }
  if (py::hasattr(object, "__cuda_array_interface__")) return fromCudaArrayInterface(object, what);
  if (py::hasattr(object, "__dlpack_device__") && py::hasattr(object, "__dlpack__")) {
    auto where = object.attr("__dlpack_device__")().cast<py::tuple>();
    if (where[0].cast<int>() == DLPACK_CUDA) {
      if (!cudaRuntime().available) raiseNoCuda();
      return fromDlpack(object, what);
    }
  }
  return nullptr;
}

py::object deviceArrayOf(kj::Array<const kj::byte> bytes, int device) {
  return py::cast(DeviceArray{std::make_shared<Held>(kj::mv(bytes), py::none()), device, true});
}

void bindDevice(py::module_& m) {
  py::class_<DeviceArray>(m, "DeviceArray")
      .def_static("allocate", &allocateArray, py::arg("nbytes"), py::arg("device") = 0)
      .def_static("from_bytes", &fromBytes, py::arg("data"), py::arg("device") = 0)
      .def("to_bytes", &DeviceArray::toBytes)
      .def_property_readonly("nbytes", &DeviceArray::size)
      .def_property_readonly("device", [](const DeviceArray& a) { return a.device; })
      .def_property_readonly("ptr", &DeviceArray::pointer)
      .def_property_readonly("__cuda_array_interface__", &DeviceArray::interface)
      .def("__len__", &DeviceArray::size);
  // For troupe.Tensor (_types.py): `size` bytes of GPU memory at `pointer` into `buffer`, a
  // writable host buffer of at least that size.
  m.def("copy_from_device", [](py::buffer buffer, uintptr_t pointer, size_t size,
                               py::object stream) {
    auto info = buffer.request(true);
    if (static_cast<size_t>(info.size * info.itemsize) < size) {
      raiseInvalidArgument("the buffer is smaller than the device memory to copy");
    }
    KJ_IF_MAYBE(device, cudaDeviceOf(reinterpret_cast<const void*>(pointer))) {
      py::dict named;
      named["stream"] = stream;
      synchronizeProducer(named, *device, "a tensor");
    } else {
      if (!cudaRuntime().available) raiseNoCuda();
      raiseInvalidArgument("a __cuda_array_interface__ that points at no CUDA device's memory");
    }
    py::gil_scoped_release released;
    copyCudaMemory(info.ptr, reinterpret_cast<const void*>(pointer), size);
  });
  m.def("cuda_runtime", []() {
    auto& info = cudaRuntime();
    py::dict d;
    d["available"] = info.available;
    d["reason"] = info.reason;
    d["library"] = info.library;
    d["version"] = info.version;
    d["devices"] = info.devices;
    return d;
  });
}

}  // namespace troupe::python
