#pragma once
// The Cloud TPU slice types troupe knows ("v4-8", "v5p-64", "v5litepod-16", "v6e-256"): how many
// chips a slice has, how they are arranged, and how many TPU VMs host them. Used by
// ResourceConfig; the table and its sources are in tpu_types.cpp.

#include <cstdint>
#include <string>

#include <kj/common.h>
#include <kj/string.h>

namespace troupe::jobs_detail {

// One TPU generation. A slice type is "<name>-<N>", N counting TensorCores (coresPerChip per
// chip): v4-8 and v5p-8 are 4 chips, v5litepod-8 and v6e-8 are 8.
struct TpuFamily {
  kj::StringPtr name;         // as the Cloud TPU API spells it: "v4", "v5p", "v5litepod", "v6e"
  kj::StringPtr alias;        // another accepted spelling ("v5e" for "v5litepod"), or ""
  uint32_t coresPerChip;      // TensorCores per chip
  uint32_t maxSingleVmChips;  // slices up to this many chips are one VM; larger ones have
                              // 4 chips per VM
  uint32_t topologyDims;      // 3 ("2x2x1") or 2 ("4x4")
  double hostCpus;            // vCPUs of the family's (4-chip) TPU VM
  uint64_t hostRamBytes;      // RAM of that VM, bytes
  bool setsLibtpuInitArgs;    // whether replicas get LIBTPU_INIT_ARGS_DEFAULT
  kj::ArrayPtr<const kj::StringPtr> topologies;  // every slice shape, smallest first
};

// One slice type, resolved from the table.
struct TpuSlice {
  const TpuFamily& family;
  std::string variant;   // canonical type, "<family.name>-<N>" ("v5e-16" -> "v5litepod-16")
  std::string topology;  // "2x2x1", "4x4", ...
  uint32_t chips;        // chips in the slice
  uint32_t chipsPerVm;
  uint32_t vmCount;  // VMs per slice
};

// LIBTPU_INIT_ARGS for the families with setsLibtpuInitArgs (v5e, v5p, v6e); see tpu_types.cpp.
extern const kj::StringPtr LIBTPU_INIT_ARGS_DEFAULT;

// "v4, v5p, v5litepod (or v5e), v6e", for error messages.
kj::StringPtr knownTpuFamilies();

// The slice `type` names. Throws INVALID_ARGUMENT naming `type` for an unknown family (listing
// the known ones) or a size the family does not have (naming the nearest sizes it has).
TpuSlice lookupTpuSlice(kj::StringPtr type);

// The number of chips `topology` ("AxB" or "AxBxC", each a positive integer) arranges, when it
// has `dims` dimensions; nullptr when it is malformed or has another number of dimensions.
kj::Maybe<uint64_t> topologyChips(kj::StringPtr topology, uint32_t dims);

}  // namespace troupe::jobs_detail
