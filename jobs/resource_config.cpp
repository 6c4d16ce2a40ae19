#include "troupe/jobs/resource_config.h"

#include <algorithm>
#include <cmath>
#include <set>

#include <kj/debug.h>
#include <kj/vector.h>

#include "troupe/base/errors.h"
#include "troupe/base/parse_number.h"
#include "troupe/jobs/detail/tpu_types.h"

namespace troupe {

namespace {

[[noreturn]] void invalid(kj::StringPtr message) {
  throwError(ErrorCode::INVALID_ARGUMENT, message);
}

// ---------------------------------------------------------------------------------------------
// Sizes

[[noreturn]] void badSize(kj::StringPtr text, kj::StringPtr why) {
  invalid(kj::str("'", printable(text), "' is not a size: ", why,
                  " (write bytes, \"1048576\", or a number with a unit: \"16g\", \"512m\", "
                  "\"8Gi\", \"1.5Ti\")"));
}

// The multiplier of `unit` (already lower-case), or 0 for none known.
uint64_t unitMultiplier(kj::StringPtr unit) {
  struct Unit {
    kj::StringPtr name;
    uint64_t multiplier;
  };
  static constexpr Unit UNITS[] = {
      {"k"_kj, 1000ull},          {"kb"_kj, 1000ull},          {"m"_kj, 1000000ull},
      {"mb"_kj, 1000000ull},      {"g"_kj, 1000000000ull},     {"gb"_kj, 1000000000ull},
      {"t"_kj, 1000000000000ull}, {"tb"_kj, 1000000000000ull}, {"ki"_kj, 1ull << 10},
      {"kib"_kj, 1ull << 10},     {"mi"_kj, 1ull << 20},       {"mib"_kj, 1ull << 20},
      {"gi"_kj, 1ull << 30},      {"gib"_kj, 1ull << 30},      {"ti"_kj, 1ull << 40},
      {"tib"_kj, 1ull << 40},
  };
  for (auto& u : UNITS) {
    if (unit == u.name) return u.multiplier;
  }
  return 0;
}

// True when `text` is 1 to `maxSize` visible ASCII characters (no spaces, no control bytes).
bool isVisibleName(kj::StringPtr text, size_t maxSize) {
  if (text.size() == 0 || text.size() > maxSize) return false;
  for (char c : text) {
    if (c <= ' ' || c >= 0x7f) return false;
  }
  return true;
}

// ---------------------------------------------------------------------------------------------
// Devices

// toString(device), quotable in an error message.
kj::String describe(const Device& device) {
  auto text = toString(device);
  return printable(kj::ArrayPtr<const char>(text.data(), text.size()));
}

kj::StringPtr kindName(const Device& device) {
  switch (device.index()) {
    case 0:
      return "cpu"_kj;
    case 1:
      return "gpu"_kj;
    default:
      return "tpu"_kj;
  }
}

// The slice `variant` names, with `what` ("device", "alternative 1") before the error.
jobs_detail::TpuSlice sliceFor(kj::StringPtr what, kj::StringPtr variant) {
  try {
    return jobs_detail::lookupTpuSlice(variant);
  } catch (const kj::Exception& e) {
    invalid(kj::str(what, ": ", errorMessage(e)));
  }
}

void validateGpu(kj::StringPtr what, const GpuDevice& gpu) {
  if (!isVisibleName(gpu.variant, 64)) {
    invalid(kj::str(what, ": GPU variant '", printable(gpu.variant),
                    "' must be 1 to 64 visible ASCII characters (e.g. \"H100\")"));
  }
  if (gpu.count == 0) {
    invalid(kj::str(what, ": gpu ", printable(gpu.variant), " needs a count of at least 1"));
  }
}

void validateTpu(kj::StringPtr what, const TpuDevice& tpu) {
  if (tpu.variant.empty()) {
    invalid(kj::str(what,
                    ": a TPU device needs a variant, a slice type such as v5p-8 (known "
                    "families: ",
                    jobs_detail::knownTpuFamilies(), ")"));
  }
  auto slice = sliceFor(what, tpu.variant);
  if (tpu.chipsPerVm != slice.chipsPerVm || tpu.vmCount != slice.vmCount) {
    invalid(kj::str(what, ": tpu ", printable(tpu.variant), " has ", slice.vmCount, " VM(s) of ",
                    slice.chipsPerVm, " chips per slice, not ", tpu.vmCount, " of ", tpu.chipsPerVm,
                    " (ResourceConfig::withTpu fills these in)"));
  }
  bool fits = false;
  KJ_IF_MAYBE(chips, jobs_detail::topologyChips(tpu.topology, slice.family.topologyDims)) {
    fits = *chips == slice.chips;
  }
  if (!fits) {
    invalid(kj::str(what, ": topology '", printable(tpu.topology), "' does not arrange the ",
                    slice.chips, " chips of tpu ", printable(tpu.variant), " in ",
                    slice.family.topologyDims, " dimensions (its table topology is ",
                    slice.topology, ")"));
  }
}

void validateDevice(kj::StringPtr what, const Device& device) {
  if (auto* gpu = std::get_if<GpuDevice>(&device)) validateGpu(what, *gpu);
  if (auto* tpu = std::get_if<TpuDevice>(&device)) validateTpu(what, *tpu);
}

// Throws INVALID_ARGUMENT unless TPU slices `a` and `b` have as many VMs and chips per VM.
void requireSameShape(const TpuDevice& a, const TpuDevice& b) {
  if (a.vmCount == b.vmCount && a.chipsPerVm == b.chipsPerVm) return;
  invalid(kj::str("TPU alternatives must agree on VMs per slice and chips per VM: ",
                  printable(a.variant), " is ", a.vmCount, " VM(s) x ", a.chipsPerVm, " chips, ",
                  printable(b.variant), " is ", b.vmCount, " VM(s) x ", b.chipsPerVm, " chips"));
}

uint32_t checkedReplicas(uint64_t replicas, kj::StringPtr what) {
  if (replicas > UINT32_MAX) {
    invalid(kj::str(what, " gives ", replicas, " replicas, more than ", UINT32_MAX));
  }
  return static_cast<uint32_t>(replicas);
}

}  // namespace

uint64_t parseBytes(kj::StringPtr text) {
  if (text.size() == 0) badSize(text, "it is empty");
  if (text[0] == '-') badSize(text, "it is negative");
  if (!isDigit(text[0])) badSize(text, "it does not start with a digit");

  constexpr unsigned __int128 MAX = UINT64_MAX;
  // The digits from `i` on.
  auto digitsAt = [&](size_t i) {
    size_t end = i;
    while (end < text.size() && isDigit(text[end])) ++end;
    return text.slice(i, end);
  };
  auto wholeDigits = digitsAt(0);
  size_t i = wholeDigits.size();
  unsigned __int128 whole = 0;
  KJ_IF_MAYBE(w, parseWholeNumber(wholeDigits)) {
    whole = *w;
  } else {
    badSize(text, "it is more than 2^64 - 1 bytes");
  }
  bool hasFraction = false;
  unsigned __int128 fraction = 0;
  unsigned __int128 fractionScale = 1;
  if (i < text.size() && text[i] == '.') {
    hasFraction = true;
    auto fractionDigits = digitsAt(i + 1);
    if (fractionDigits.size() == 0) badSize(text, "it has no digits after the point");
    if (fractionDigits.size() > 18) badSize(text, "it has more than 18 digits after the point");
    fraction = KJ_ASSERT_NONNULL(parseWholeNumber(fractionDigits));
    for (size_t d = 0; d < fractionDigits.size(); ++d) fractionScale *= 10;
    i += 1 + fractionDigits.size();
  }

  kj::StringPtr unitText = text.slice(i);
  if (unitText.size() == 0) {
    if (hasFraction) badSize(text, "a fraction needs a unit (plain bytes are whole)");
    return static_cast<uint64_t>(whole);
  }
  kj::String unit = kj::heapString(unitText);
  for (char& c : unit) {
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  }
  uint64_t multiplier = unitMultiplier(unit);
  if (multiplier == 0) {
    badSize(text, kj::str("'", printable(unitText), "' is not a unit"));
  }
  // Below 2^64 x 2^40 and 10^18 x 2^40: no overflow in 128 bits.
  unsigned __int128 bytes = whole * multiplier +
                            (fraction * multiplier + fractionScale - 1) / fractionScale;
  if (bytes > MAX) badSize(text, "it is more than 2^64 - 1 bytes");
  return static_cast<uint64_t>(bytes);
}

std::string toString(const Device& device) {
  if (auto* gpu = std::get_if<GpuDevice>(&device)) {
    return std::string(kj::str("gpu ", gpu->variant, "x", gpu->count).cStr());
  }
  if (auto* tpu = std::get_if<TpuDevice>(&device)) {
    return "tpu " + tpu->variant;
  }
  return "cpu";
}

std::string describe(const ResourceConfig& config) {
  kj::Vector<kj::String> parts;
  if (config.cpu > 0) parts.add(kj::str(config.cpu, config.cpu == 1 ? " cpu" : " cpus"));
  auto bytes = [](uint64_t n) {
    if (n % (uint64_t{1} << 30) == 0) return kj::str(n >> 30, " GiB");
    if (n % (uint64_t{1} << 20) == 0) return kj::str(n >> 20, " MiB");
    return kj::str(n, " bytes");
  };
  if (config.ramBytes > 0) parts.add(kj::str(bytes(config.ramBytes), " memory"));
  if (config.diskBytes > 0) parts.add(kj::str(bytes(config.diskBytes), " disk"));
  if (parts.empty()) parts.add(kj::str("nothing reserved"));
  parts.add(kj::str(toString(config.device).c_str()));
  return kj::strArray(parts, ", ").cStr();
}

ResourceConfig ResourceConfig::withCpu(double cpus, kj::StringPtr ram) {
  ResourceConfig config;
  config.cpu = cpus;
  config.ramBytes = parseBytes(ram);
  config.validate();
  return config;
}

ResourceConfig ResourceConfig::withGpu(kj::StringPtr variant, uint32_t count, double cpus,
                                       kj::StringPtr ram) {
  ResourceConfig config;
  config.cpu = cpus;
  config.ramBytes = parseBytes(ram);
  config.device = GpuDevice{.variant = variant.cStr(), .count = count};
  config.validate();
  return config;
}

ResourceConfig ResourceConfig::withTpu(kj::StringPtr type, uint32_t sliceCount) {
  return withTpu(std::vector<std::string>{type.cStr()}, sliceCount);
}

ResourceConfig ResourceConfig::withTpu(std::initializer_list<std::string> types,
                                       uint32_t sliceCount) {
  return withTpu(std::vector<std::string>(types), sliceCount);
}

ResourceConfig ResourceConfig::withTpu(const std::vector<std::string>& types, uint32_t sliceCount) {
  if (types.empty()) invalid("withTpu needs at least one TPU type");
  if (sliceCount == 0) invalid("withTpu needs a slice count of at least 1");
  ResourceConfig config;
  double hostCpus = 0;
  uint64_t hostRam = 0;
  for (size_t i = 0; i < types.size(); ++i) {
    auto slice = jobs_detail::lookupTpuSlice(types[i]);
    TpuDevice tpu{.variant = slice.variant,
                  .topology = slice.topology,
                  .chipsPerVm = slice.chipsPerVm,
                  .vmCount = slice.vmCount};
    if (i == 0) {
      config.device = tpu;
      hostCpus = slice.family.hostCpus;
      hostRam = slice.family.hostRamBytes;
    } else {
      requireSameShape(std::get<TpuDevice>(config.device), tpu);
      config.alternatives.push_back(tpu);
      // A replica may land on any of them: ask for what the smallest host can give.
      hostCpus = std::min(hostCpus, slice.family.hostCpus);
      hostRam = std::min(hostRam, slice.family.hostRamBytes);
    }
  }
  config.cpu = hostCpus / 2;
  config.ramBytes = hostRam / 2;
  config.replicas = checkedReplicas(
      uint64_t{sliceCount} * std::get<TpuDevice>(config.device).vmCount,
      kj::str(sliceCount, " slices of ", std::get<TpuDevice>(config.device).variant));
  config.validate();
  return config;
}

uint32_t ResourceConfig::chipCount() const {
  if (auto* gpu = std::get_if<GpuDevice>(&device)) return gpu->count;
  if (auto* tpu = std::get_if<TpuDevice>(&device)) return tpu->chipsPerVm;
  return 0;
}

ResourceConfig ResourceConfig::scale(uint32_t factor) const {
  if (factor == 0) invalid("scale factor must be at least 1");
  ResourceConfig scaled = *this;
  scaled.replicas = checkedReplicas(uint64_t{replicas} * factor,
                                    kj::str("scaling ", replicas, " by ", factor));
  return scaled;
}

void ResourceConfig::validate() const {
  if (!(cpu >= 0) || !std::isfinite(cpu)) {
    invalid(kj::str("cpu must be a number of cores, 0 or more (0 reserves none), not ", cpu));
  }
  if (replicas == 0) invalid("replicas must be at least 1");

  size_t wildcards = 0;
  for (auto& region : regions) {
    if (region == ANY_REGION) {
      ++wildcards;
    } else if (!isVisibleName(region, 128)) {
      invalid(
          kj::str("region '", printable(region), "' must be 1 to 128 visible ASCII characters"));
    }
  }
  if (wildcards > 0 && wildcards < regions.size()) {
    auto named = std::find_if(regions.begin(), regions.end(),
                              [](const std::string& r) { return r != ANY_REGION; });
    invalid(kj::str("ANY_REGION ('", ANY_REGION, "') cannot be mixed with named regions such as '",
                    printable(*named), "': list regions, or ANY_REGION alone"));
  }

  validateDevice("device", device);
  for (size_t i = 0; i < alternatives.size(); ++i) {
    auto what = kj::str("alternative ", i + 1);
    auto& alternative = alternatives[i];
    if (alternative.index() != device.index()) {
      invalid(kj::str(what, " (", describe(alternative), ") is not a ", kindName(device),
                      " device like the device (", describe(device), ")"));
    }
    validateDevice(what, alternative);
    if (auto* tpu = std::get_if<TpuDevice>(&alternative)) {
      requireSameShape(std::get<TpuDevice>(device), *tpu);
    }
  }
}

std::map<std::string, std::string> ResourceConfig::deviceEnvironment(
    const std::vector<uint32_t>& gpuIndexes,
    const std::map<std::string, std::string>& userEnvironment) const {
  auto* gpu = std::get_if<GpuDevice>(&device);
  if (!gpuIndexes.empty()) {
    if (gpu == nullptr) {
      invalid(kj::str("a ", kindName(device), " replica is given no GPUs, but got ",
                      gpuIndexes.size(), " GPU index(es)"));
    }
    std::set<uint32_t> distinct(gpuIndexes.begin(), gpuIndexes.end());
    if (gpuIndexes.size() != gpu->count || distinct.size() != gpuIndexes.size()) {
      invalid(kj::str("a ", describe(device), " replica needs ", gpu->count,
                      " distinct GPU indexes, got ", kj::strArray(gpuIndexes, ",")));
    }
  }

  std::map<std::string, std::string> env;
  auto set = [&](const std::string& name, std::string value) {
    if (userEnvironment.count(name) == 0) env.emplace(name, std::move(value));
  };
  if (std::holds_alternative<CpuDevice>(device)) {
    set("JAX_PLATFORMS", "cpu");
  } else {
    set("JAX_PLATFORMS", "");
  }
  if (gpu != nullptr && !gpuIndexes.empty()) {
    set("CUDA_VISIBLE_DEVICES", kj::strArray(gpuIndexes, ",").cStr());
  }
  if (auto* tpu = std::get_if<TpuDevice>(&device)) {
    auto slice = sliceFor("device", tpu->variant);
    if (slice.family.setsLibtpuInitArgs) {
      set("LIBTPU_INIT_ARGS", jobs_detail::LIBTPU_INIT_ARGS_DEFAULT.cStr());
    }
  }
  return env;
}

}  // namespace troupe
