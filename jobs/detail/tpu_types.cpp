#include "troupe/jobs/detail/tpu_types.h"

#include <algorithm>

#include <kj/debug.h>

#include "troupe/base/errors.h"
#include "troupe/base/parse_number.h"

namespace troupe::jobs_detail {

namespace {

// Slice shapes, smallest first; a slice type's N is chips x coresPerChip.
//
// v4 and v5p: 4 chips per VM (machine type ct4p-hightpu-4t / ct5p-hightpu-4t), 2 TensorCores per
// chip, so v4-N / v5p-N has N/2 chips on N/8 VMs. The shapes are those the GKE launcher xpk
// accepts (github.com/AI-Hypercomputer/xpk, src/xpk/core/system_characteristics.py), which
// contain every shape of the Cloud TPU docs' tables (cloud.google.com/tpu/docs/v4,
// cloud.google.com/tpu/docs/v5p: v5p-8 2x2x1, v5p-16 2x2x2, v5p-64 2x4x4, v5p-128 4x4x4, ...,
// v5p-12288 16x16x24). Beyond the small shapes every dimension is a multiple of 4, so the v5p
// sizes past v5p-128 are the multiples of 128 TensorCores (64 chips) that have such a shape.
// xpk also lists v5p 12x24x24 and 16x20x28; they are left out because the v5p docs give
// 16x16x24 (6144 chips) as the largest slice. The v4 docs mention further twisted-torus shapes
// (12x12x24) that have no accelerator type in xpk; they are left out too.
constexpr kj::StringPtr V4_TOPOLOGIES[] = {
    "2x2x1"_kj, "2x2x2"_kj, "2x2x4"_kj,  "2x4x4"_kj,  "4x4x4"_kj,   "4x4x8"_kj,
    "4x8x8"_kj, "8x8x8"_kj, "8x8x12"_kj, "8x8x16"_kj, "8x16x16"_kj,
};

constexpr kj::StringPtr V5P_TOPOLOGIES[] = {
    "2x2x1"_kj,    "2x2x2"_kj,    "2x2x4"_kj,    "2x4x4"_kj,    "4x4x4"_kj,    "4x4x8"_kj,
    "4x4x12"_kj,   "4x8x8"_kj,    "4x4x20"_kj,   "4x8x12"_kj,   "4x4x28"_kj,   "8x8x8"_kj,
    "4x12x12"_kj,  "4x8x20"_kj,   "4x4x44"_kj,   "8x8x12"_kj,   "4x4x52"_kj,   "4x8x28"_kj,
    "4x12x20"_kj,  "8x8x16"_kj,   "4x4x68"_kj,   "8x12x12"_kj,  "4x4x76"_kj,   "8x8x20"_kj,
    "4x12x28"_kj,  "4x8x44"_kj,   "4x4x92"_kj,   "8x12x16"_kj,  "4x20x20"_kj,  "4x8x52"_kj,
    "12x12x12"_kj, "8x8x28"_kj,   "4x4x116"_kj,  "8x12x20"_kj,  "4x4x124"_kj,  "8x16x16"_kj,
    "4x12x44"_kj,  "4x8x68"_kj,   "4x20x28"_kj,  "12x12x16"_kj, "4x4x148"_kj,  "4x8x76"_kj,
    "4x12x52"_kj,  "8x16x20"_kj,  "4x4x164"_kj,  "8x12x28"_kj,  "4x4x172"_kj,  "8x8x44"_kj,
    "12x12x20"_kj, "4x8x92"_kj,   "4x4x188"_kj,  "12x16x16"_kj, "4x28x28"_kj,  "8x20x20"_kj,
    "4x12x68"_kj,  "8x8x52"_kj,   "4x4x212"_kj,  "12x12x24"_kj, "4x20x44"_kj,  "8x16x28"_kj,
    "4x12x76"_kj,  "4x8x116"_kj,  "4x4x236"_kj,  "12x16x20"_kj, "4x4x244"_kj,  "4x8x124"_kj,
    "12x12x28"_kj, "16x16x16"_kj, "4x20x52"_kj,  "8x12x44"_kj,  "8x8x68"_kj,   "4x12x92"_kj,
    "8x20x28"_kj,  "12x16x24"_kj, "4x8x148"_kj,  "12x20x20"_kj, "8x8x76"_kj,   "4x28x44"_kj,
    "8x12x52"_kj,  "16x16x20"_kj, "12x12x36"_kj, "4x8x164"_kj,  "12x16x28"_kj, "4x20x68"_kj,
    "4x8x172"_kj,  "4x12x116"_kj, "8x16x44"_kj,  "12x20x24"_kj, "4x28x52"_kj,  "8x8x92"_kj,
    "4x12x124"_kj, "4x8x188"_kj,  "4x20x76"_kj,  "16x16x24"_kj,
};

// v5e (v5litepod) and v6e: 1 TensorCore per chip, so v5litepod-N / v6e-N has N chips. The
// 2D shapes are the Cloud TPU docs' (cloud.google.com/tpu/docs/v5e, cloud.google.com/tpu/docs/v6e
// "Supported configurations"; xpk agrees): 1x1, 2x2 and 2x4 are one VM with 1, 4 or 8 chips
// (the TPU API's single-host types; GKE can also run 2x4 as two 4-chip VMs, which troupe does not
// model), 4x4 to 16x16 are 4 chips per VM.
constexpr kj::StringPtr V5E_V6E_TOPOLOGIES[] = {
    "1x1"_kj, "2x2"_kj, "2x4"_kj, "4x4"_kj, "4x8"_kj, "8x8"_kj, "8x16"_kj, "16x16"_kj,
};

constexpr uint64_t GB = 1000 * 1000 * 1000;

// Host vCPUs and RAM are those of each family's 4-chip TPU VM (the Cloud TPU docs' system
// specifications; issue 4 fixes these numbers): v4 240 / 400 GB, v5e 112 / 192 GB, v5p 208 /
// 448 GB, v6e 180 / 720 GB. The sub-host VMs (v5litepod-1, v6e-1) are smaller machines.
const TpuFamily FAMILIES[] = {
    {"v4"_kj, ""_kj, 2, 4, 3, 240, 400 * GB, false, V4_TOPOLOGIES},
    {"v5p"_kj, ""_kj, 2, 4, 3, 208, 448 * GB, true, V5P_TOPOLOGIES},
    {"v5litepod"_kj, "v5e"_kj, 1, 8, 2, 112, 192 * GB, true, V5E_V6E_TOPOLOGIES},
    {"v6e"_kj, ""_kj, 1, 8, 2, 180, 720 * GB, true, V5E_V6E_TOPOLOGIES},
};

// Every dimension of `topology` multiplied, or nullptr when it is not "AxB..." of `dims` positive
// integers.
kj::Maybe<uint64_t> product(kj::StringPtr topology, uint32_t dims) {
  uint64_t total = 1;
  uint32_t seen = 0;
  kj::ArrayPtr<const char> rest = topology;
  while (true) {
    auto x = std::find(rest.begin(), rest.end(), 'x');
    KJ_IF_MAYBE(dim, parseWholeNumber(kj::arrayPtr(rest.begin(), x), 1000000)) {
      if (*dim == 0) return nullptr;
      total *= *dim;
    } else {
      return nullptr;
    }
    if (total > (uint64_t{1} << 40)) return nullptr;
    ++seen;
    if (x == rest.end()) break;
    rest = kj::arrayPtr(x + 1, rest.end());
  }
  if (seen != dims) return nullptr;
  return total;
}

uint64_t chipsOf(const TpuFamily& family, kj::StringPtr topology) {
  KJ_IF_MAYBE(chips, product(topology, family.topologyDims)) {
    return *chips;
  }
  KJ_FAIL_ASSERT("malformed topology in the TPU table", family.name, topology);
}

// The size (N in "<family>-<N>") of `family`'s slice shaped `topology`.
uint64_t sizeOf(const TpuFamily& family, kj::StringPtr topology) {
  return chipsOf(family, topology) * family.coresPerChip;
}

kj::Maybe<const TpuFamily&> findFamily(kj::StringPtr name) {
  for (auto& family : FAMILIES) {
    if (name == family.name || (family.alias.size() > 0 && name == family.alias)) return family;
  }
  return nullptr;
}

// The decimal number `text` spells (digits only, at most 9), or nullptr.
kj::Maybe<uint32_t> parseSize(kj::StringPtr text) {
  KJ_IF_MAYBE(value, parseWholeNumber(text, 999999999)) {
    return static_cast<uint32_t>(*value);
  }
  return nullptr;
}

[[noreturn]] void unknownType(kj::StringPtr type) {
  throwError(ErrorCode::INVALID_ARGUMENT,
             kj::str("unknown TPU type '", printable(type), "': known families are ",
                     knownTpuFamilies(), ", as <family>-<size> (e.g. v5p-8, v6e-16)"));
}

// Throws INVALID_ARGUMENT for `size`, which `family` does not have, naming the sizes around it.
[[noreturn]] void unknownSize(kj::StringPtr type, const TpuFamily& family, uint64_t size) {
  kj::Maybe<uint64_t> below;
  kj::Maybe<uint64_t> above;
  for (auto topology : family.topologies) {
    uint64_t candidate = sizeOf(family, topology);
    if (candidate < size) below = candidate;
    if (candidate > size && above == nullptr) above = candidate;
  }
  kj::String nearest;
  KJ_IF_MAYBE(b, below) {
    KJ_IF_MAYBE(a, above) {
      nearest = kj::str("the nearest are ", family.name, "-", *b, " and ", family.name, "-", *a);
    } else {
      nearest = kj::str("the largest is ", family.name, "-", *b);
    }
  } else KJ_IF_MAYBE(a, above) {
    nearest = kj::str("the smallest is ", family.name, "-", *a);
  }
  throwError(ErrorCode::INVALID_ARGUMENT,
             kj::str("TPU type '", printable(type), "' is not a ", family.name,
                     " slice size (N counts TensorCores, ", family.coresPerChip, " per chip); ",
                     nearest));
}

}  // namespace

// The flags MaxText's v5e training configs set for every model size
// (github.com/AI-Hypercomputer/maxtext, MaxText/configs/v5e/16b.sh and its siblings); its v5p
// configs (MaxText/configs/v5p/128b.sh) set these and a few more, and AXLearn sets the async
// collective fusion ones for v6e as "maxtext xla flags" (github.com/apple/axlearn,
// axlearn/common/compiler_options.py). They make collectives asynchronous and overlap them with
// compute, and let data-parallel all-reduces run during the backward pass; tuning beyond them is
// per model, so a replica that wants other flags sets LIBTPU_INIT_ARGS itself (the user's value
// wins).
const kj::StringPtr LIBTPU_INIT_ARGS_DEFAULT =
    "--xla_tpu_enable_data_parallel_all_reduce_opt=true"
    " --xla_tpu_data_parallel_opt_different_sized_ops=true"
    " --xla_tpu_enable_async_collective_fusion=true"
    " --xla_tpu_enable_async_collective_fusion_fuse_all_gather=true"
    " --xla_tpu_enable_async_collective_fusion_multiple_steps=true"
    " --xla_tpu_overlap_compute_collective_tc=true"
    " --xla_enable_async_all_gather=true"_kj;

kj::StringPtr knownTpuFamilies() { return "v4, v5p, v5litepod (or v5e), v6e"_kj; }

TpuSlice lookupTpuSlice(kj::StringPtr type) {
  kj::Maybe<size_t> dash;
  for (size_t i = 0; i < type.size(); ++i) {
    if (type[i] == '-') dash = i;
  }
  KJ_IF_MAYBE(d, dash) {
    auto name = kj::heapString(type.slice(0, *d));
    KJ_IF_MAYBE(family, findFamily(name)) {
      KJ_IF_MAYBE(size, parseSize(type.slice(*d + 1))) {
        for (auto topology : family->topologies) {
          if (sizeOf(*family, topology) != *size) continue;
          uint32_t chips = static_cast<uint32_t>(chipsOf(*family, topology));
          uint32_t perVm = chips <= family->maxSingleVmChips ? chips : 4;
          return TpuSlice{*family,
                          std::string(kj::str(family->name, "-", *size).cStr()),
                          std::string(topology.cStr()),
                          chips,
                          perVm,
                          chips / perVm};
        }
        unknownSize(type, *family, *size);
      }
      throwError(ErrorCode::INVALID_ARGUMENT,
                 kj::str("TPU type '", printable(type), "': the size after '", family->name,
                         "-' must be a number of TensorCores (e.g. ", family->name, "-",
                         sizeOf(*family, family->topologies[0]), ")"));
    }
  }
  unknownType(type);
}

kj::Maybe<uint64_t> topologyChips(kj::StringPtr topology, uint32_t dims) {
  return product(topology, dims);
}

}  // namespace troupe::jobs_detail
