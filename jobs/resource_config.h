#pragma once
// ResourceConfig: what each replica of a job needs (cpu, memory, disk, an accelerator) and where
// it may run.
//
//   auto rc = troupe::ResourceConfig::withCpu(2, "4g");
//   auto gpu = troupe::ResourceConfig::withGpu("H100", 8);
//   auto tpu = troupe::ResourceConfig::withTpu("v5p-8", 2);     // 2 slices -> 2 replicas

#include <cstdint>
#include <initializer_list>
#include <map>
#include <string>
#include <variant>
#include <vector>

#include <kj/string.h>

namespace troupe {

// Parses a size: plain bytes ("1048576"), or a number with a unit: decimal "k", "m", "g", "t"
// (also "kb", "mb", "gb", "tb"; 1g = 10^9) or binary "Ki", "Mi", "Gi", "Ti" (also "KiB", ...;
// 1Gi = 2^30), units in any case. Fractions are allowed with a unit ("1.5g", "0.5Gi"; at most 18
// digits after the point), rounded up to a whole byte. No spaces, signs or exponents. Throws
// INVALID_ARGUMENT naming the text for anything else (empty, negative, unknown unit, a fraction
// without a unit, over 2^64 - 1 bytes).
uint64_t parseBytes(kj::StringPtr text);

// A region list entry meaning "any region"; it cannot be mixed with named regions.
constexpr kj::StringPtr ANY_REGION = "*"_kj;

struct CpuDevice {
  bool operator==(const CpuDevice&) const = default;
};

struct GpuDevice {
  std::string variant;  // e.g. "H100", "A100-80G"; any name of 1-64 visible ASCII characters
  uint32_t count = 1;   // per replica
  bool operator==(const GpuDevice&) const = default;
};

// A TPU slice; withTpu() fills every field from the slice table (jobs/detail/tpu_types.cpp).
struct TpuDevice {
  std::string variant;   // the slice type, e.g. "v5p-8", "v5litepod-16", "v6e-4", "v4-32"
  std::string topology;  // the chips' arrangement, e.g. "2x2x1" (v4, v5p) or "4x4" (v5e, v6e)
  uint32_t chipsPerVm = 0;
  uint32_t vmCount = 0;  // VMs per slice
  bool operator==(const TpuDevice&) const = default;
};

using Device = std::variant<CpuDevice, GpuDevice, TpuDevice>;

// "cpu", "gpu H100x8", "tpu v5p-8".
std::string toString(const Device& device);

struct ResourceConfig;

// What each replica of `config` is given, for people: "2 cpus, 4 GiB memory, gpu H100x8", or
// "nothing reserved, cpu" when it reserves nothing.
std::string describe(const ResourceConfig& config);

// A plain value; every field can be set directly, and the factories fill in consistent
// defaults. validate() checks the whole.
//
// A launcher reserves cpu cores and ramBytes of memory per replica and starts a job only when
// its replicas' reservations fit. By default nothing is reserved (cpu 0, ramBytes 0), as Ray
// reserves nothing for an actor unless asked: a job of any size starts at once, and the
// replicas share the machine. Ask for cores and memory (withCpu) to keep jobs from crowding it.
struct ResourceConfig {
  double cpu = 0;          // cores reserved per replica; 0 (the default): none
  uint64_t ramBytes = 0;   // memory reserved per replica, bytes; 0 (default): none
  uint64_t diskBytes = 0;  // scratch disk per replica (0 = no requirement)
  Device device = CpuDevice{};
  std::vector<Device> alternatives;  // other devices the job can run on instead
  uint32_t replicas = 1;             // how many replicas the job has
  std::vector<std::string> regions;  // empty or {ANY_REGION}: anywhere
  std::string zone;                  // "" = any
  bool preemptible = false;
  std::string image;  // container image, "" = none

  // `cpus` cores and `ram` memory per replica (a size parseBytes() reads), on CPUs. Like every
  // factory, throws INVALID_ARGUMENT for a malformed size or anything validate() refuses.
  static ResourceConfig withCpu(double cpus, kj::StringPtr ram = "1g");

  // `count` GPUs of `variant` per replica, with `cpus` cores and `ram` memory.
  static ResourceConfig withGpu(kj::StringPtr variant, uint32_t count, double cpus = 8,
                                kj::StringPtr ram = "64g");

  // `sliceCount` slices of TPU type `type` ("v4-8", "v5p-16", "v5litepod-4", "v6e-16", ...;
  // "v5e-N" is read as "v5litepod-N"), one replica per TPU VM: replicas = sliceCount x VMs per
  // slice. Host cpu and ram default to half of the TPU VM's host (v4 120 cores / 200 GB, v5e
  // 56 / 96 GB, v5p 104 / 224 GB, v6e 90 / 360 GB; with alternatives, the smallest of them). With
  // several types, the first is the device and the others its alternatives; they must agree on
  // VM count and chips per VM. Throws INVALID_ARGUMENT for an unknown type or size (naming the
  // known families, or the nearest sizes), for no types, for sliceCount 0, and for alternatives
  // that disagree (naming both).
  static ResourceConfig withTpu(kj::StringPtr type, uint32_t sliceCount = 1);
  static ResourceConfig withTpu(const std::vector<std::string>& types, uint32_t sliceCount = 1);
  // The same, so that withTpu({"v5p-8", "v4-8"}) is not read as a StringPtr (begin, end) pair.
  static ResourceConfig withTpu(std::initializer_list<std::string> types, uint32_t sliceCount = 1);

  // Accelerator chips per replica (GPUs, or TPU chips per VM); 0 for CPU.
  uint32_t chipCount() const;

  // The same job `factor` times larger: `factor` times the replicas (for a TPU job, `factor`
  // times the slices). Throws INVALID_ARGUMENT for factor 0.
  ResourceConfig scale(uint32_t factor) const;

  // Throws INVALID_ARGUMENT saying what is wrong: negative (or non-finite) cpu, zero replicas,
  // an empty region name or one with spaces, ANY_REGION mixed with named regions, alternatives
  // of another kind than the device (or, for TPUs, disagreeing on VM count or chips per VM), an
  // empty or malformed GPU variant, a zero GPU count, an unknown TPU type, a TPU device whose
  // chips per VM or VM count differ from its type's, or whose topology does not arrange its
  // slice's chips.
  void validate() const;

  // The environment variables a replica on this device gets, for the GPUs `gpuIndexes` given to
  // it on its machine:
  //   JAX_PLATFORMS         "cpu" on CPUs; set and empty on GPUs and TPUs (JAX picks the
  //                         accelerator)
  //   LIBTPU_INIT_ARGS      on v5e, v5p and v6e: jobs_detail::LIBTPU_INIT_ARGS_DEFAULT (MaxText's
  //                         collective-overlap flags); not set on v4
  //   CUDA_VISIBLE_DEVICES  on GPUs: the indexes, comma-separated ("0,1"); not set when
  //                         `gpuIndexes` is empty (the platform decides what the replica sees)
  // A variable set in `userEnvironment` (even to "") wins: it is left out of the result.
  // Throws INVALID_ARGUMENT when `gpuIndexes` is not empty and is not `count` distinct indexes of
  // a GPU device, or is given to a CPU or TPU device, and for a TPU device of unknown type.
  std::map<std::string, std::string> deviceEnvironment(
      const std::vector<uint32_t>& gpuIndexes,
      const std::map<std::string, std::string>& userEnvironment = {}) const;

  bool operator==(const ResourceConfig&) const = default;
};

}  // namespace troupe
