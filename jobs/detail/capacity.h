#pragma once
// What a local machine has, and the bookkeeping of what its running replicas hold.

#include <cstdint>
#include <string>
#include <vector>

#include <kj/common.h>
#include <kj/string.h>

#include "troupe/jobs/local_launcher.h"
#include "troupe/jobs/resource_config.h"

namespace troupe::jobs_detail {

// Detects this machine: cores online (sysconf(_SC_NPROCESSORS_ONLN)), MemTotal from
// <procRoot>/meminfo, and the NVIDIA GPUs listed in <procRoot>/driver/nvidia/gpus/ (one
// directory each). Without a readable meminfo, memory is sysconf's physical pages; without the
// NVIDIA directory, there are no GPUs.
MachineResources detectMachine(kj::StringPtr procRoot = "/proc");

// What one replica needs of a local machine.
struct ReplicaNeed {
  uint64_t milliCpus = 0;
  uint64_t ramBytes = 0;
  uint32_t gpus = 0;
  kj::Maybe<std::string> foreignDevice;  // a device no local machine has (a TPU), described
};

ReplicaNeed needOf(const ResourceConfig& resources);

// What one replica was given.
struct Allocation {
  uint64_t milliCpus = 0;
  uint64_t ramBytes = 0;
  std::vector<uint32_t> gpus;  // indexes, ascending
};

// "2", "0.5", "1.25" (cores, at most 3 decimals).
std::string formatCpus(uint64_t milliCpus);
// "512 B", "4 GiB", "1.5 GiB" (binary units, at most one decimal).
std::string formatBytes(uint64_t bytes);

// The machine's capacity and what is free of it. GPUs are handed out lowest index first.
// Loop thread only.
class CapacityLedger {
public:
  explicit CapacityLedger(MachineResources machine);

  // Why `replicas` replicas needing `need` each could never run here, even on the empty
  // machine ("needs 4 x 2 cpus, the machine has 4"); null when they could.
  kj::Maybe<std::string> neverFits(const ReplicaNeed& need, uint32_t replicas) const;

  // Why they do not all fit what is free now ("needs 4 x 2 cpus, 3 of 8 free"); null when
  // they do.
  kj::Maybe<std::string> shortfall(const ReplicaNeed& need, uint32_t replicas) const;

  // Takes one replica's share; requires that it fits.
  Allocation take(const ReplicaNeed& need);

  // Gives a share back.
  void give(const Allocation& allocation);

  MachineResources machine() const;
  MachineResources available() const;

private:
  kj::Maybe<std::string> compare(const ReplicaNeed& need, uint32_t replicas, uint64_t milliCpus,
                                 uint64_t ramBytes, uint32_t gpus, bool empty) const;

  uint64_t totalMilliCpus;
  uint64_t totalRam;
  std::vector<bool> gpuFree;  // by index
  uint64_t freeMilliCpus;
  uint64_t freeRam;
};

}  // namespace troupe::jobs_detail
