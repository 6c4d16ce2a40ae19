#include "troupe/jobs/detail/capacity.h"

#include <dirent.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <cmath>

#include <kj/debug.h>

namespace troupe::jobs_detail {

namespace {

uint64_t memTotal(const std::string& path) {
  FILE* f = fopen(path.c_str(), "re");
  if (f == nullptr) return 0;
  char line[256];
  uint64_t kib = 0;
  while (fgets(line, sizeof(line), f) != nullptr) {
    unsigned long long value = 0;
    if (sscanf(line, "MemTotal: %llu kB", &value) == 1) {
      kib = value;
      break;
    }
  }
  fclose(f);
  return kib * 1024;
}

uint32_t nvidiaGpus(const std::string& path) {
  DIR* dir = opendir(path.c_str());
  if (dir == nullptr) return 0;
  uint32_t count = 0;
  while (auto* entry = readdir(dir)) {
    if (entry->d_name[0] != '.') ++count;
  }
  closedir(dir);
  return count;
}

// "4 x 2 cpus" / "2 cpus" for one replica.
std::string times(uint32_t replicas, const std::string& each) {
  return replicas == 1 ? each : std::to_string(replicas) + " x " + each;
}

std::string plural(uint64_t n, const char* word) {
  return std::to_string(n) + " " + word + (n == 1 ? "" : "s");
}

// a * b, saturating (requests are user input: 2^40 replicas of 2^40 bytes must not wrap).
uint64_t product(uint64_t a, uint64_t b) {
  unsigned __int128 p = static_cast<unsigned __int128>(a) * b;
  return p > UINT64_MAX ? UINT64_MAX : static_cast<uint64_t>(p);
}

// Cores to millicores, bounded (a billion cores fits any machine description).
uint64_t milli(double cores) {
  if (!(cores > 0)) return 0;
  return static_cast<uint64_t>(std::llround(std::min(cores, 1e12) * 1000));
}

std::string cpus(uint64_t m) { return formatCpus(m) + (m == 1000 ? " cpu" : " cpus"); }

}  // namespace

MachineResources detectMachine(kj::StringPtr procRoot) {
  MachineResources m;
  long online = sysconf(_SC_NPROCESSORS_ONLN);
  m.cpus = online > 0 ? static_cast<double>(online) : 1;
  std::string root(procRoot.cStr());
  m.ramBytes = memTotal(root + "/meminfo");
  if (m.ramBytes == 0) {
    long pages = sysconf(_SC_PHYS_PAGES);
    long pageSize = sysconf(_SC_PAGESIZE);
    if (pages > 0 && pageSize > 0) m.ramBytes = uint64_t(pages) * uint64_t(pageSize);
  }
  m.gpus = nvidiaGpus(root + "/driver/nvidia/gpus");
  return m;
}

ReplicaNeed needOf(const ResourceConfig& resources) {
  ReplicaNeed need;
  need.milliCpus = milli(resources.cpu);
  need.ramBytes = resources.ramBytes;
  if (auto* gpu = std::get_if<GpuDevice>(&resources.device)) {
    need.gpus = gpu->count;
  } else if (std::holds_alternative<TpuDevice>(resources.device)) {
    need.foreignDevice = toString(resources.device);
  }
  return need;
}

std::string formatCpus(uint64_t milliCpus) {
  std::string s = std::to_string(milliCpus / 1000);
  uint64_t frac = milliCpus % 1000;
  if (frac != 0) {
    char digits[8];
    snprintf(digits, sizeof(digits), "%03llu", static_cast<unsigned long long>(frac));
    std::string f = digits;
    while (!f.empty() && f.back() == '0') f.pop_back();
    s += "." + f;
  }
  return s;
}

std::string formatBytes(uint64_t bytes) {
  static const char* const UNITS[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  int unit = 0;
  double value = static_cast<double>(bytes);
  while (value >= 1024 && unit < 5) {
    value /= 1024;
    ++unit;
  }
  char text[32];
  if (unit == 0 || std::fabs(value - std::round(value)) < 0.05) {
    snprintf(text, sizeof(text), "%.0f %s", value, UNITS[unit]);
  } else {
    snprintf(text, sizeof(text), "%.1f %s", value, UNITS[unit]);
  }
  return text;
}

CapacityLedger::CapacityLedger(MachineResources machine)
    : totalMilliCpus(milli(machine.cpus)),
      totalRam(machine.ramBytes),
      gpuFree(machine.gpus, true),
      freeMilliCpus(totalMilliCpus),
      freeRam(totalRam) {}

kj::Maybe<std::string> CapacityLedger::compare(const ReplicaNeed& need, uint32_t replicas,
                                               uint64_t milliCpus, uint64_t ramBytes, uint32_t gpus,
                                               bool empty) const {
  KJ_IF_MAYBE(device, need.foreignDevice) {
    return "needs a " + *device + " device, which a local machine does not have";
  }
  std::vector<std::string> problems;
  auto of = [&](const std::string& free, const std::string& total) {
    return empty ? "the machine has " + total : free + " of " + total + " free";
  };
  if (product(need.milliCpus, replicas) > milliCpus) {
    problems.push_back("needs " + times(replicas, cpus(need.milliCpus)) + ", " +
                       of(formatCpus(milliCpus), cpus(totalMilliCpus)));
  }
  if (product(need.ramBytes, replicas) > ramBytes) {
    problems.push_back("needs " + times(replicas, formatBytes(need.ramBytes)) + " of memory, " +
                       of(formatBytes(ramBytes), formatBytes(totalRam)));
  }
  if (product(need.gpus, replicas) > gpus) {
    problems.push_back("needs " + times(replicas, plural(need.gpus, "GPU")) + ", " +
                       of(std::to_string(gpus), plural(gpuFree.size(), "GPU")));
  }
  if (problems.empty()) return nullptr;
  std::string text;
  for (auto& p : problems) text += (text.empty() ? "" : "; ") + p;
  return text;
}

kj::Maybe<std::string> CapacityLedger::neverFits(const ReplicaNeed& need, uint32_t replicas) const {
  return compare(need, replicas, totalMilliCpus, totalRam, static_cast<uint32_t>(gpuFree.size()),
                 true);
}

kj::Maybe<std::string> CapacityLedger::shortfall(const ReplicaNeed& need, uint32_t replicas) const {
  return compare(need, replicas, freeMilliCpus, freeRam, available().gpus, false);
}

Allocation CapacityLedger::take(const ReplicaNeed& need) {
  KJ_REQUIRE(need.milliCpus <= freeMilliCpus && need.ramBytes <= freeRam &&
                 need.gpus <= available().gpus,
             "CapacityLedger::take() without room");
  Allocation a;
  a.milliCpus = need.milliCpus;
  a.ramBytes = need.ramBytes;
  freeMilliCpus -= need.milliCpus;
  freeRam -= need.ramBytes;
  for (uint32_t i = 0; i < gpuFree.size() && a.gpus.size() < need.gpus; ++i) {
    if (gpuFree[i]) {
      gpuFree[i] = false;
      a.gpus.push_back(i);
    }
  }
  return a;
}

void CapacityLedger::give(const Allocation& allocation) {
  KJ_ASSERT(freeMilliCpus + allocation.milliCpus <= totalMilliCpus &&
                freeRam + allocation.ramBytes <= totalRam,
            "a share of the machine was given back twice");
  freeMilliCpus += allocation.milliCpus;
  freeRam += allocation.ramBytes;
  for (auto i : allocation.gpus) {
    KJ_ASSERT(i < gpuFree.size() && !gpuFree[i], "a GPU was given back twice", i);
    gpuFree[i] = true;
  }
}

MachineResources CapacityLedger::machine() const {
  return {totalMilliCpus / 1000.0, totalRam, static_cast<uint32_t>(gpuFree.size())};
}

MachineResources CapacityLedger::available() const {
  uint32_t gpus = 0;
  for (bool f : gpuFree) gpus += f;
  return {freeMilliCpus / 1000.0, freeRam, gpus};
}

}  // namespace troupe::jobs_detail
