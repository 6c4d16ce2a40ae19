// resource_config.h: size parsing, the factories (with the TPU slice table), validate(),
// chipCount(), scale() and the device environment. Pure: no process, loop or environment.

#include "troupe/jobs/resource_config.h"

#include <cmath>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "troupe/base/errors.h"
#include "troupe/jobs/detail/tpu_types.h"

namespace troupe {
namespace {

using Env = std::map<std::string, std::string>;

constexpr uint64_t KB = 1000;
constexpr uint64_t MB = 1000 * KB;
constexpr uint64_t GB = 1000 * MB;
constexpr uint64_t TB = 1000 * GB;
constexpr uint64_t KI = 1024;
constexpr uint64_t MI = 1024 * KI;
constexpr uint64_t GI = 1024 * MI;
constexpr uint64_t TI = 1024 * GI;

std::string str(kj::StringPtr s) { return std::string(s.begin(), s.size()); }

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

// The description of the INVALID_ARGUMENT `fn` throws; fails the test when it throws nothing or
// something else.
std::string invalidArgument(const std::function<void()>& fn) {
  try {
    fn();
    ADD_FAILURE() << "no exception";
  } catch (const kj::Exception& e) {
    EXPECT_EQ(errorCode(e), ErrorCode::INVALID_ARGUMENT) << str(e.getDescription());
    return str(e.getDescription());
  }
  return "";
}

std::string badSize(kj::StringPtr text) {
  return invalidArgument([&]() { parseBytes(text); });
}

const TpuDevice& tpuOf(const ResourceConfig& rc) { return std::get<TpuDevice>(rc.device); }

// ---------------------------------------------------------------------------------------------
// parseBytes

TEST(ParseBytesTest, PlainBytes) {
  EXPECT_EQ(parseBytes("0"), 0u);
  EXPECT_EQ(parseBytes("1"), 1u);
  EXPECT_EQ(parseBytes("1048576"), 1048576u);
  EXPECT_EQ(parseBytes("007"), 7u);
  EXPECT_EQ(parseBytes("18446744073709551615"), UINT64_MAX);
}

TEST(ParseBytesTest, DecimalUnitsInAnyCase) {
  EXPECT_EQ(parseBytes("16g"), 16 * GB);
  EXPECT_EQ(parseBytes("512m"), 512 * MB);
  EXPECT_EQ(parseBytes("3k"), 3 * KB);
  EXPECT_EQ(parseBytes("2t"), 2 * TB);
  EXPECT_EQ(parseBytes("16G"), 16 * GB);
  EXPECT_EQ(parseBytes("16gb"), 16 * GB);
  EXPECT_EQ(parseBytes("16GB"), 16 * GB);
  EXPECT_EQ(parseBytes("16Gb"), 16 * GB);
  EXPECT_EQ(parseBytes("5kb"), 5 * KB);
  EXPECT_EQ(parseBytes("5KB"), 5 * KB);
  EXPECT_EQ(parseBytes("7MB"), 7 * MB);
  EXPECT_EQ(parseBytes("1TB"), TB);
  EXPECT_EQ(parseBytes("0g"), 0u);
}

TEST(ParseBytesTest, BinaryUnitsInAnyCase) {
  EXPECT_EQ(parseBytes("8Gi"), 8 * GI);
  EXPECT_EQ(parseBytes("512Mi"), 512 * MI);
  EXPECT_EQ(parseBytes("4Ki"), 4 * KI);
  EXPECT_EQ(parseBytes("2Ti"), 2 * TI);
  EXPECT_EQ(parseBytes("8GiB"), 8 * GI);
  EXPECT_EQ(parseBytes("512MiB"), 512 * MI);
  EXPECT_EQ(parseBytes("4KiB"), 4 * KI);
  EXPECT_EQ(parseBytes("1TiB"), TI);
  EXPECT_EQ(parseBytes("8gi"), 8 * GI);
  EXPECT_EQ(parseBytes("8GIB"), 8 * GI);
  EXPECT_EQ(parseBytes("64kib"), 64 * KI);
}

TEST(ParseBytesTest, FractionsWithAUnit) {
  EXPECT_EQ(parseBytes("1.5g"), 1500 * MB);
  EXPECT_EQ(parseBytes("0.5Gi"), 512 * MI);
  EXPECT_EQ(parseBytes("1.25Ki"), 1280u);
  EXPECT_EQ(parseBytes("2.5TB"), 2500 * GB);
  EXPECT_EQ(parseBytes("0.001k"), 1u);
  EXPECT_EQ(parseBytes("1.000k"), 1000u);
  EXPECT_EQ(parseBytes("0.000000000000000001t"), 1u);  // 18 digits
}

TEST(ParseBytesTest, FractionsRoundUpToAWholeByte) {
  EXPECT_EQ(parseBytes("0.0001k"), 1u);         // 0.1 byte
  EXPECT_EQ(parseBytes("1.0001k"), 1001u);      // 1000.1 bytes
  EXPECT_EQ(parseBytes("0.1Ki"), 103u);         // 102.4 bytes
  EXPECT_EQ(parseBytes("1.3Gi"), 1395864372u);  // 1395864371.2 bytes
}

TEST(ParseBytesTest, LargestValues) {
  EXPECT_EQ(parseBytes("16777215Ti"), 16777215 * TI);
  EXPECT_EQ(parseBytes("18446744t"), 18446744 * TB);
  EXPECT_EQ(parseBytes("18446744.073709551615t"), UINT64_MAX);
}

TEST(ParseBytesTest, EmptyIsRefused) {
  EXPECT_TRUE(contains(badSize(""), "'' is not a size: it is empty")) << badSize("");
}

TEST(ParseBytesTest, NegativeIsRefused) {
  EXPECT_TRUE(contains(badSize("-5g"), "'-5g' is not a size: it is negative"));
  EXPECT_TRUE(contains(badSize("-1"), "it is negative"));
}

TEST(ParseBytesTest, NonNumbersAreRefused) {
  for (auto text : {"g", "abc", "+5g", " 16g", ".5g", "Gi"}) {
    auto message = badSize(text);
    EXPECT_TRUE(contains(message, "it does not start with a digit")) << text << ": " << message;
  }
}

TEST(ParseBytesTest, UnknownUnitsAreRefused) {
  EXPECT_TRUE(contains(badSize("16x"), "'16x' is not a size: 'x' is not a unit"));
  EXPECT_TRUE(contains(badSize("1p"), "'p' is not a unit"));
  EXPECT_TRUE(contains(badSize("1Pi"), "'Pi' is not a unit"));
  EXPECT_TRUE(contains(badSize("512b"), "'b' is not a unit"));
  EXPECT_TRUE(contains(badSize("16 g"), "' g' is not a unit"));
  EXPECT_TRUE(contains(badSize("16g "), "'g ' is not a unit"));
  EXPECT_TRUE(contains(badSize("16gg"), "'gg' is not a unit"));
  EXPECT_TRUE(contains(badSize("1e9"), "'e9' is not a unit"));
  EXPECT_TRUE(contains(badSize("16gib2"), "'gib2' is not a unit"));
  EXPECT_TRUE(contains(badSize("1.5.5g"), "'.5g' is not a unit"));
  EXPECT_TRUE(contains(badSize("1,5g"), "',5g' is not a unit"));
}

TEST(ParseBytesTest, BadFractionsAreRefused) {
  EXPECT_TRUE(contains(badSize("1.5"), "'1.5' is not a size: a fraction needs a unit"));
  EXPECT_TRUE(contains(badSize("1."), "it has no digits after the point"));
  EXPECT_TRUE(contains(badSize("1.g"), "it has no digits after the point"));
  EXPECT_TRUE(
      contains(badSize("1.0000000000000000001g"), "it has more than 18 digits after the point"));
}

TEST(ParseBytesTest, OverflowIsRefused) {
  EXPECT_TRUE(contains(badSize("18446744073709551616"), "it is more than 2^64 - 1 bytes"));
  EXPECT_TRUE(contains(badSize("99999999999999999999999"), "it is more than 2^64 - 1 bytes"));
  EXPECT_TRUE(contains(badSize("16777216Ti"), "it is more than 2^64 - 1 bytes"));
  EXPECT_TRUE(contains(badSize("18446744.073709551616t"), "it is more than 2^64 - 1 bytes"));
  EXPECT_TRUE(contains(badSize("18446744073709551615k"), "it is more than 2^64 - 1 bytes"));
}

TEST(ParseBytesTest, ErrorsQuoteControlCharactersPrintably) {
  auto message = badSize("16\ng");
  EXPECT_TRUE(contains(message, "'16\\x0ag' is not a size")) << message;
  EXPECT_FALSE(contains(message, "\n")) << message;
}

// ---------------------------------------------------------------------------------------------
// toString, defaults

TEST(ResourceConfigTest, DeviceToString) {
  EXPECT_EQ(toString(CpuDevice{}), "cpu");
  EXPECT_EQ(toString(GpuDevice{.variant = "H100", .count = 8}), "gpu H100x8");
  EXPECT_EQ(toString(TpuDevice{.variant = "v5p-8"}), "tpu v5p-8");
}

TEST(ResourceConfigTest, DefaultIsOneCpuReplicaAnywhereReservingNothing) {
  ResourceConfig rc;
  EXPECT_EQ(rc.cpu, 0);
  EXPECT_EQ(rc.ramBytes, 0u);
  EXPECT_EQ(rc.diskBytes, 0u);
  EXPECT_EQ(rc.device, Device(CpuDevice{}));
  EXPECT_TRUE(rc.alternatives.empty());
  EXPECT_EQ(rc.replicas, 1u);
  EXPECT_TRUE(rc.regions.empty());
  EXPECT_EQ(rc.zone, "");
  EXPECT_FALSE(rc.preemptible);
  EXPECT_EQ(rc.image, "");
  EXPECT_EQ(rc.chipCount(), 0u);
  rc.validate();
}

// ---------------------------------------------------------------------------------------------
// withCpu, withGpu

TEST(ResourceConfigTest, WithCpu) {
  auto rc = ResourceConfig::withCpu(2, "4g");
  EXPECT_EQ(rc.cpu, 2);
  EXPECT_EQ(rc.ramBytes, 4 * GB);
  EXPECT_EQ(rc.device, Device(CpuDevice{}));
  EXPECT_EQ(rc.replicas, 1u);
  EXPECT_EQ(rc.chipCount(), 0u);

  auto half = ResourceConfig::withCpu(0.5);
  EXPECT_EQ(half.cpu, 0.5);
  EXPECT_EQ(half.ramBytes, GB);
}

TEST(ResourceConfigTest, WithCpuRefusesBadInput) {
  EXPECT_TRUE(contains(invalidArgument([] { ResourceConfig::withCpu(-2, "1g"); }),
                       "cpu must be a number of cores, 0 or more (0 reserves none), not -2"));
  // Reserving nothing is allowed.
  ResourceConfig::withCpu(0, "0").validate();
  EXPECT_TRUE(contains(invalidArgument([] { ResourceConfig::withCpu(2, "lots"); }),
                       "'lots' is not a size"));
}

TEST(ResourceConfigTest, WithGpu) {
  auto rc = ResourceConfig::withGpu("H100", 8);
  EXPECT_EQ(rc.device, Device(GpuDevice{.variant = "H100", .count = 8}));
  EXPECT_EQ(rc.cpu, 8);
  EXPECT_EQ(rc.ramBytes, 64 * GB);
  EXPECT_EQ(rc.replicas, 1u);
  EXPECT_EQ(rc.chipCount(), 8u);

  auto small = ResourceConfig::withGpu("A100-80G", 1, 4, "32Gi");
  EXPECT_EQ(small.device, Device(GpuDevice{.variant = "A100-80G", .count = 1}));
  EXPECT_EQ(small.cpu, 4);
  EXPECT_EQ(small.ramBytes, 32 * GI);
  EXPECT_EQ(small.chipCount(), 1u);
}

TEST(ResourceConfigTest, WithGpuAcceptsUnknownWellFormedVariants) {
  auto rc = ResourceConfig::withGpu("MI300X", 4);
  EXPECT_EQ(std::get<GpuDevice>(rc.device).variant, "MI300X");
  ResourceConfig::withGpu("nvidia-l4_24GB.v2", 1);
  ResourceConfig::withGpu(std::string(64, 'G').c_str(), 1);
}

TEST(ResourceConfigTest, WithGpuRefusesMalformedVariants) {
  for (auto variant : {"", "H 100", " H100", "H100\n", "H100\t", "\x7f", "H\xc3\xa9"}) {
    auto message = invalidArgument([&] { ResourceConfig::withGpu(variant, 1); });
    EXPECT_TRUE(contains(message, "device: GPU variant '")) << message;
    EXPECT_TRUE(contains(message, "must be 1 to 64 visible ASCII characters")) << message;
  }
  auto tooLong = std::string(65, 'G');
  EXPECT_TRUE(contains(invalidArgument([&] { ResourceConfig::withGpu(tooLong.c_str(), 1); }),
                       "must be 1 to 64 visible ASCII characters"));
  EXPECT_TRUE(contains(invalidArgument([] { ResourceConfig::withGpu("H\n100", 1); }),
                       "GPU variant 'H\\x0a100'"));
}

TEST(ResourceConfigTest, WithGpuRefusesZeroCountAndBadHost) {
  EXPECT_TRUE(contains(invalidArgument([] { ResourceConfig::withGpu("H100", 0); }),
                       "device: gpu H100 needs a count of at least 1"));
  EXPECT_TRUE(contains(invalidArgument([] { ResourceConfig::withGpu("H100", 8, -1); }),
                       "cpu must be a number of cores, 0 or more"));
  EXPECT_TRUE(contains(invalidArgument([] { ResourceConfig::withGpu("H100", 8, 8, "64q"); }),
                       "'64q' is not a size"));
}

// ---------------------------------------------------------------------------------------------
// withTpu: the slice table

struct SliceCase {
  const char* type;
  uint32_t sliceCount;
  const char* variant;
  const char* topology;
  uint32_t chipsPerVm;
  uint32_t vmCount;
  uint32_t replicas;
};

void expectSlice(const SliceCase& c) {
  SCOPED_TRACE(c.type);
  auto rc = ResourceConfig::withTpu(c.type, c.sliceCount);
  auto& tpu = tpuOf(rc);
  EXPECT_EQ(tpu.variant, c.variant);
  EXPECT_EQ(tpu.topology, c.topology);
  EXPECT_EQ(tpu.chipsPerVm, c.chipsPerVm);
  EXPECT_EQ(tpu.vmCount, c.vmCount);
  EXPECT_EQ(rc.replicas, c.replicas);
  EXPECT_EQ(rc.chipCount(), c.chipsPerVm);
  EXPECT_TRUE(rc.alternatives.empty());
}

TEST(WithTpuTest, V4Slices) {
  // v4-N: N TensorCores, N/2 chips, N/8 VMs of 4 chips.
  expectSlice({"v4-8", 1, "v4-8", "2x2x1", 4, 1, 1});
  expectSlice({"v4-16", 1, "v4-16", "2x2x2", 4, 2, 2});
  expectSlice({"v4-32", 1, "v4-32", "2x2x4", 4, 4, 4});
  expectSlice({"v4-128", 1, "v4-128", "4x4x4", 4, 16, 16});
  expectSlice({"v4-1536", 1, "v4-1536", "8x8x12", 4, 192, 192});
  expectSlice({"v4-4096", 1, "v4-4096", "8x16x16", 4, 512, 512});
}

TEST(WithTpuTest, V5pSlices) {
  expectSlice({"v5p-8", 1, "v5p-8", "2x2x1", 4, 1, 1});
  expectSlice({"v5p-8", 2, "v5p-8", "2x2x1", 4, 1, 2});
  expectSlice({"v5p-16", 1, "v5p-16", "2x2x2", 4, 2, 2});
  expectSlice({"v5p-64", 2, "v5p-64", "2x4x4", 4, 8, 16});
  expectSlice({"v5p-128", 1, "v5p-128", "4x4x4", 4, 16, 16});
  expectSlice({"v5p-384", 1, "v5p-384", "4x4x12", 4, 48, 48});
  expectSlice({"v5p-12288", 1, "v5p-12288", "16x16x24", 4, 1536, 1536});
}

TEST(WithTpuTest, V5litepodSlices) {
  // 1, 4 and 8 chips on one VM; from 16 chips on, 4 chips per VM.
  expectSlice({"v5litepod-1", 1, "v5litepod-1", "1x1", 1, 1, 1});
  expectSlice({"v5litepod-4", 1, "v5litepod-4", "2x2", 4, 1, 1});
  expectSlice({"v5litepod-8", 1, "v5litepod-8", "2x4", 8, 1, 1});
  expectSlice({"v5litepod-16", 1, "v5litepod-16", "4x4", 4, 4, 4});
  expectSlice({"v5litepod-32", 1, "v5litepod-32", "4x8", 4, 8, 8});
  expectSlice({"v5litepod-64", 1, "v5litepod-64", "8x8", 4, 16, 16});
  expectSlice({"v5litepod-128", 1, "v5litepod-128", "8x16", 4, 32, 32});
  expectSlice({"v5litepod-256", 1, "v5litepod-256", "16x16", 4, 64, 64});
  expectSlice({"v5litepod-256", 3, "v5litepod-256", "16x16", 4, 64, 192});
}

TEST(WithTpuTest, V5eIsReadAsV5litepod) {
  expectSlice({"v5e-16", 1, "v5litepod-16", "4x4", 4, 4, 4});
  expectSlice({"v5e-8", 1, "v5litepod-8", "2x4", 8, 1, 1});
}

TEST(WithTpuTest, V6eSlices) {
  expectSlice({"v6e-1", 1, "v6e-1", "1x1", 1, 1, 1});
  expectSlice({"v6e-4", 1, "v6e-4", "2x2", 4, 1, 1});
  expectSlice({"v6e-8", 1, "v6e-8", "2x4", 8, 1, 1});
  expectSlice({"v6e-16", 1, "v6e-16", "4x4", 4, 4, 4});
  expectSlice({"v6e-32", 1, "v6e-32", "4x8", 4, 8, 8});
  expectSlice({"v6e-256", 1, "v6e-256", "16x16", 4, 64, 64});
  expectSlice({"v6e-256", 2, "v6e-256", "16x16", 4, 64, 128});
}

TEST(WithTpuTest, EveryTableSliceIsConsistent) {
  // Every size up to twice the largest (all of them to 64, then every multiple of 8) either is
  // refused or gives N/coresPerChip chips that its topology arranges, on VMs of 4 chips (or one
  // VM of up to 8 for v5e/v6e).
  struct Family {
    const char* name;
    uint32_t coresPerChip;
    uint32_t dims;
    uint32_t largest;
    size_t expectedSizes;
  };
  for (auto f : {Family{"v4", 2, 3, 4096, 11}, Family{"v5p", 2, 3, 12288, 94},
                 Family{"v5litepod", 1, 2, 256, 8}, Family{"v6e", 1, 2, 256, 8}}) {
    size_t sizes = 0;
    for (uint32_t n = 1; n <= 2 * f.largest; n += n < 64 ? 1 : 8) {
      auto type = kj::str(f.name, "-", n);
      ResourceConfig rc;
      try {
        rc = ResourceConfig::withTpu(type);
      } catch (const kj::Exception& e) {
        EXPECT_EQ(errorCode(e), ErrorCode::INVALID_ARGUMENT);
        continue;
      }
      ++sizes;
      SCOPED_TRACE(type.cStr());
      auto& tpu = tpuOf(rc);
      uint32_t chips = n / f.coresPerChip;
      EXPECT_EQ(n % f.coresPerChip, 0u);
      EXPECT_EQ(tpu.chipsPerVm * tpu.vmCount, chips);
      EXPECT_TRUE(tpu.chipsPerVm == 4 || (tpu.vmCount == 1 && tpu.chipsPerVm <= 8));
      KJ_IF_MAYBE(arranged, jobs_detail::topologyChips(tpu.topology.c_str(), f.dims)) {
        EXPECT_EQ(*arranged, chips);
      } else {
        ADD_FAILURE() << "malformed topology " << tpu.topology;
      }
    }
    EXPECT_EQ(sizes, f.expectedSizes) << f.name;
  }
}

TEST(WithTpuTest, HostDefaultsToHalfTheTpuVm) {
  auto v4 = ResourceConfig::withTpu("v4-8");
  EXPECT_EQ(v4.cpu, 120);
  EXPECT_EQ(v4.ramBytes, 200 * GB);
  auto v5e = ResourceConfig::withTpu("v5litepod-16");
  EXPECT_EQ(v5e.cpu, 56);
  EXPECT_EQ(v5e.ramBytes, 96 * GB);
  auto v5p = ResourceConfig::withTpu("v5p-8");
  EXPECT_EQ(v5p.cpu, 104);
  EXPECT_EQ(v5p.ramBytes, 224 * GB);
  EXPECT_EQ(v5p.ramBytes, 224000000000u);
  auto v6e = ResourceConfig::withTpu("v6e-16");
  EXPECT_EQ(v6e.cpu, 90);
  EXPECT_EQ(v6e.ramBytes, 360 * GB);
  EXPECT_EQ(v6e.diskBytes, 0u);
  EXPECT_FALSE(v6e.preemptible);
}

TEST(WithTpuTest, UnknownFamiliesListTheKnownOnes) {
  for (auto type : {"v3-8", "v7-8", "tpu-v5p-8", "v5p", "", "-8", "V5P-8", "v5p_8"}) {
    auto message = invalidArgument([&] { ResourceConfig::withTpu(type); });
    EXPECT_TRUE(contains(message, kj::str("unknown TPU type '", type, "'").cStr())) << message;
    EXPECT_TRUE(contains(message, "known families are v4, v5p, v5litepod (or v5e), v6e"))
        << message;
  }
}

TEST(WithTpuTest, UnknownSizesNameTheNearest) {
  EXPECT_TRUE(contains(invalidArgument([] { ResourceConfig::withTpu("v5p-24"); }),
                       "TPU type 'v5p-24' is not a v5p slice size (N counts TensorCores, 2 per "
                       "chip); the nearest are v5p-16 and v5p-32"));
  EXPECT_TRUE(
      contains(invalidArgument([] { ResourceConfig::withTpu("v4-4"); }), "the smallest is v4-8"));
  EXPECT_TRUE(contains(invalidArgument([] { ResourceConfig::withTpu("v4-8192"); }),
                       "the largest is v4-4096"));
  EXPECT_TRUE(contains(invalidArgument([] { ResourceConfig::withTpu("v5p-24576"); }),
                       "the largest is v5p-12288"));
  EXPECT_TRUE(contains(invalidArgument([] { ResourceConfig::withTpu("v5litepod-2"); }),
                       "the nearest are v5litepod-1 and v5litepod-4"));
  EXPECT_TRUE(contains(invalidArgument([] { ResourceConfig::withTpu("v5e-512"); }),
                       "'v5e-512' is not a v5litepod slice size"));
  EXPECT_TRUE(contains(invalidArgument([] { ResourceConfig::withTpu("v6e-12"); }),
                       "the nearest are v6e-8 and v6e-16"));
  EXPECT_TRUE(
      contains(invalidArgument([] { ResourceConfig::withTpu("v6e-0"); }), "the smallest is v6e-1"));
}

TEST(WithTpuTest, NonNumericSizesAreRefused) {
  for (auto type : {"v5p-", "v5p-x", "v5p-8x", "v5p- 8", "v5p-+8", "v5p-1234567890"}) {
    auto message = invalidArgument([&] { ResourceConfig::withTpu(type); });
    EXPECT_TRUE(contains(message, "the size after 'v5p-' must be a number of TensorCores (e.g. "
                                  "v5p-8)"))
        << message;
  }
}

TEST(WithTpuTest, ZeroSlicesOrNoTypesAreRefused) {
  EXPECT_TRUE(contains(invalidArgument([] { ResourceConfig::withTpu("v5p-8", 0); }),
                       "withTpu needs a slice count of at least 1"));
  EXPECT_TRUE(contains(invalidArgument([] { ResourceConfig::withTpu(std::vector<std::string>{}); }),
                       "withTpu needs at least one TPU type"));
}

TEST(WithTpuTest, TooManyReplicasAreRefused) {
  // 1536 VMs x 3000000 slices does not fit in 32 bits.
  EXPECT_TRUE(contains(invalidArgument([] { ResourceConfig::withTpu("v5p-12288", 3000000); }),
                       "3000000 slices of v5p-12288 gives 4608000000 replicas, more than "
                       "4294967295"));
}

// ---------------------------------------------------------------------------------------------
// withTpu: alternatives

TEST(WithTpuTest, AlternativesThatAgree) {
  // One VM of 4 chips each.
  auto rc = ResourceConfig::withTpu({"v5p-8", "v4-8", "v5litepod-4", "v6e-4"}, 2);
  EXPECT_EQ(tpuOf(rc).variant, "v5p-8");
  ASSERT_EQ(rc.alternatives.size(), 3u);
  EXPECT_EQ(rc.alternatives[0],
            Device(
                TpuDevice{.variant = "v4-8", .topology = "2x2x1", .chipsPerVm = 4, .vmCount = 1}));
  EXPECT_EQ(rc.alternatives[1],
            Device(TpuDevice{
                .variant = "v5litepod-4", .topology = "2x2", .chipsPerVm = 4, .vmCount = 1}));
  EXPECT_EQ(rc.alternatives[2],
            Device(
                TpuDevice{.variant = "v6e-4", .topology = "2x2", .chipsPerVm = 4, .vmCount = 1}));
  EXPECT_EQ(rc.replicas, 2u);
  EXPECT_EQ(rc.chipCount(), 4u);
  // A replica may land on any of them: the smallest host (v5e: 112 / 192 GB) halved.
  EXPECT_EQ(rc.cpu, 56);
  EXPECT_EQ(rc.ramBytes, 96 * GB);
  rc.validate();
}

TEST(WithTpuTest, MultiVmAlternativesThatAgree) {
  // 4 VMs of 4 chips: v4-32 (2x2x4), v5p-32 (2x2x4), v5e-16 (4x4), v6e-16 (4x4).
  auto rc = ResourceConfig::withTpu({"v6e-16", "v5p-32", "v5e-16"});
  EXPECT_EQ(tpuOf(rc).variant, "v6e-16");
  ASSERT_EQ(rc.alternatives.size(), 2u);
  EXPECT_EQ(std::get<TpuDevice>(rc.alternatives[0]).variant, "v5p-32");
  EXPECT_EQ(std::get<TpuDevice>(rc.alternatives[1]).variant, "v5litepod-16");
  EXPECT_EQ(rc.replicas, 4u);
  EXPECT_EQ(rc.cpu, 56);
  EXPECT_EQ(rc.ramBytes, 96 * GB);
}

TEST(WithTpuTest, AlternativesThatDisagreeNameBoth) {
  // Same chip count (8), but one VM of 8 chips against two VMs of 4.
  auto message = invalidArgument([] { ResourceConfig::withTpu({"v6e-8", "v5p-16"}); });
  EXPECT_TRUE(contains(message, "TPU alternatives must agree on VMs per slice and chips per VM: "
                                "v6e-8 is 1 VM(s) x 8 chips, v5p-16 is 2 VM(s) x 4 chips"))
      << message;
  // Same VM count (1), other chips per VM.
  message = invalidArgument([] { ResourceConfig::withTpu({"v5p-8", "v5litepod-8"}); });
  EXPECT_TRUE(contains(message, "v5p-8 is 1 VM(s) x 4 chips, v5litepod-8 is 1 VM(s) x 8 chips"))
      << message;
  // An unknown alternative.
  message = invalidArgument([] { ResourceConfig::withTpu({"v5p-8", "v9-8"}); });
  EXPECT_TRUE(contains(message, "unknown TPU type 'v9-8'")) << message;
}

// ---------------------------------------------------------------------------------------------
// chipCount, scale

TEST(ResourceConfigTest, ChipCount) {
  EXPECT_EQ(ResourceConfig::withCpu(4).chipCount(), 0u);
  EXPECT_EQ(ResourceConfig::withGpu("H100", 8).chipCount(), 8u);
  EXPECT_EQ(ResourceConfig::withTpu("v5p-64").chipCount(), 4u);
  EXPECT_EQ(ResourceConfig::withTpu("v6e-8").chipCount(), 8u);
  EXPECT_EQ(ResourceConfig::withTpu("v5litepod-1").chipCount(), 1u);
}

TEST(ResourceConfigTest, ScaleMultipliesReplicas) {
  auto cpu = ResourceConfig::withCpu(2, "4g");
  cpu.replicas = 3;
  auto scaled = cpu.scale(4);
  EXPECT_EQ(scaled.replicas, 12u);
  EXPECT_EQ(scaled.cpu, 2);
  EXPECT_EQ(scaled.ramBytes, 4 * GB);
  EXPECT_EQ(cpu.replicas, 3u);  // the original is unchanged
  EXPECT_EQ(cpu.scale(1), cpu);
}

TEST(ResourceConfigTest, ScaleOfATpuJobMultipliesTheSlices) {
  auto tpu = ResourceConfig::withTpu("v5p-64", 2);  // 2 slices x 8 VMs
  auto scaled = tpu.scale(3);
  EXPECT_EQ(scaled.replicas, 48u);
  EXPECT_EQ(scaled, ResourceConfig::withTpu("v5p-64", 6));
  EXPECT_EQ(scaled.device, tpu.device);
}

TEST(ResourceConfigTest, ScaleRefusesZeroAndOverflow) {
  auto rc = ResourceConfig::withCpu(1);
  EXPECT_TRUE(contains(invalidArgument([&] { rc.scale(0); }), "scale factor must be at least 1"));
  rc.replicas = 65536;
  EXPECT_TRUE(contains(invalidArgument([&] { rc.scale(65536); }),
                       "scaling 65536 by 65536 gives 4294967296 replicas"));
  EXPECT_EQ(rc.scale(65535).replicas, 65536u * 65535u);
}

// ---------------------------------------------------------------------------------------------
// validate

std::string invalidConfig(const ResourceConfig& rc) {
  return invalidArgument([&] { rc.validate(); });
}

TEST(ValidateTest, HostResources) {
  ResourceConfig rc;
  rc.cpu = -1;
  EXPECT_TRUE(contains(invalidConfig(rc), "cpu must be a number of cores, 0 or more"));
  rc.cpu = std::nan("");
  EXPECT_TRUE(contains(invalidConfig(rc), "cpu must be a number of cores, 0 or more"));
  rc.cpu = HUGE_VAL;
  EXPECT_TRUE(contains(invalidConfig(rc), "cpu must be a number of cores, 0 or more"));
  rc.cpu = 0.25;
  rc.validate();
  rc.cpu = 0;
  rc.ramBytes = 0;
  rc.validate();  // nothing reserved
}

TEST(ValidateTest, ZeroReplicas) {
  auto rc = ResourceConfig::withTpu("v5p-8");
  rc.replicas = 0;
  EXPECT_TRUE(contains(invalidConfig(rc), "replicas must be at least 1"));
}

TEST(ValidateTest, Regions) {
  ResourceConfig rc;
  rc.regions = {"us-central1", "europe-west4"};
  rc.validate();
  rc.regions = {str(ANY_REGION)};
  rc.validate();
  rc.regions = {"*", "*"};
  rc.validate();
  rc.regions = {"us-central1", str(ANY_REGION)};
  EXPECT_TRUE(contains(invalidConfig(rc),
                       "ANY_REGION ('*') cannot be mixed with named regions such as "
                       "'us-central1'"));
  rc.regions = {"*", "europe-west4"};
  EXPECT_TRUE(contains(invalidConfig(rc), "such as 'europe-west4'"));
  rc.regions = {""};
  EXPECT_TRUE(contains(invalidConfig(rc), "region '' must be 1 to 128 visible ASCII characters"));
  rc.regions = {"us central1"};
  EXPECT_TRUE(contains(invalidConfig(rc), "region 'us central1' must be"));
}

TEST(ValidateTest, ZoneImageAndPreemptibleAreFree) {
  auto rc = ResourceConfig::withGpu("H100", 8);
  rc.zone = "us-central1-a";
  rc.image = "us-docker.pkg.dev/project/repo/trainer:latest";
  rc.preemptible = true;
  rc.diskBytes = parseBytes("100Gi");
  rc.validate();
}

TEST(ValidateTest, GpuDevices) {
  ResourceConfig rc;
  rc.device = GpuDevice{.variant = "", .count = 1};
  EXPECT_TRUE(contains(invalidConfig(rc), "device: GPU variant '' must be 1 to 64"));
  rc.device = GpuDevice{.variant = "H100", .count = 0};
  EXPECT_TRUE(contains(invalidConfig(rc), "device: gpu H100 needs a count of at least 1"));
}

TEST(ValidateTest, TpuDevices) {
  auto good = ResourceConfig::withTpu("v5p-16");
  good.validate();

  auto rc = good;
  std::get<TpuDevice>(rc.device).variant = "";
  EXPECT_TRUE(contains(invalidConfig(rc), "device: a TPU device needs a variant"));

  rc = good;
  std::get<TpuDevice>(rc.device).variant = "v9-16";
  EXPECT_TRUE(contains(invalidConfig(rc), "device: unknown TPU type 'v9-16'"));

  rc = good;
  std::get<TpuDevice>(rc.device).vmCount = 1;
  EXPECT_TRUE(contains(invalidConfig(rc),
                       "device: tpu v5p-16 has 2 VM(s) of 4 chips per slice, not 1 of 4"));

  rc = good;
  std::get<TpuDevice>(rc.device).chipsPerVm = 8;
  EXPECT_TRUE(contains(invalidConfig(rc), "not 2 of 8"));

  rc = good;
  std::get<TpuDevice>(rc.device).topology = "2x2";
  EXPECT_TRUE(contains(invalidConfig(rc),
                       "device: topology '2x2' does not arrange the 8 chips of tpu v5p-16 in 3 "
                       "dimensions (its table topology is 2x2x2)"));

  rc = good;
  std::get<TpuDevice>(rc.device).topology = "";
  EXPECT_TRUE(contains(invalidConfig(rc), "topology '' does not arrange"));

  // Another arrangement of the same chips is accepted.
  rc = good;
  std::get<TpuDevice>(rc.device).topology = "1x2x4";
  rc.validate();
}

TEST(ValidateTest, AlternativesOfAnotherKind) {
  auto rc = ResourceConfig::withGpu("H100", 8);
  rc.alternatives = {GpuDevice{.variant = "A100-80G", .count = 8}};
  rc.validate();
  rc.alternatives = {GpuDevice{.variant = "A100-80G", .count = 16}};
  rc.validate();  // GPU alternatives may differ in count
  rc.alternatives.push_back(CpuDevice{});
  EXPECT_TRUE(contains(invalidConfig(rc),
                       "alternative 2 (cpu) is not a gpu device like the device (gpu H100x8)"));
  rc.alternatives = {GpuDevice{.variant = "A 100", .count = 8}};
  EXPECT_TRUE(contains(invalidConfig(rc), "alternative 1: GPU variant 'A 100'"));
  rc.alternatives = {GpuDevice{.variant = "A100", .count = 0}};
  EXPECT_TRUE(contains(invalidConfig(rc), "alternative 1: gpu A100 needs a count of at least 1"));

  auto tpu = ResourceConfig::withTpu("v5p-8");
  tpu.alternatives = {GpuDevice{.variant = "H100", .count = 4}};
  EXPECT_TRUE(contains(invalidConfig(tpu),
                       "alternative 1 (gpu H100x4) is not a tpu device like the device (tpu "
                       "v5p-8)"));
}

TEST(ValidateTest, TpuAlternativesMustAgree) {
  auto rc = ResourceConfig::withTpu("v5p-8");
  rc.alternatives = {ResourceConfig::withTpu("v6e-8").device};
  EXPECT_TRUE(contains(invalidConfig(rc),
                       "TPU alternatives must agree on VMs per slice and chips per VM: v5p-8 is "
                       "1 VM(s) x 4 chips, v6e-8 is 1 VM(s) x 8 chips"));
  rc.alternatives = {
      TpuDevice{.variant = "v9-8", .topology = "2x2", .chipsPerVm = 4, .vmCount = 1}};
  EXPECT_TRUE(contains(invalidConfig(rc), "alternative 1: unknown TPU type 'v9-8'"));
  rc.alternatives = {ResourceConfig::withTpu("v6e-4").device};
  rc.validate();
}

// ---------------------------------------------------------------------------------------------
// deviceEnvironment

TEST(DeviceEnvironmentTest, Cpu) {
  auto rc = ResourceConfig::withCpu(2);
  EXPECT_EQ(rc.deviceEnvironment({}), (Env{{"JAX_PLATFORMS", "cpu"}}));
}

TEST(DeviceEnvironmentTest, Gpu) {
  auto rc = ResourceConfig::withGpu("H100", 2);
  EXPECT_EQ(rc.deviceEnvironment({3, 1}),
            (Env{{"JAX_PLATFORMS", ""}, {"CUDA_VISIBLE_DEVICES", "3,1"}}));
  auto one = ResourceConfig::withGpu("L4", 1);
  EXPECT_EQ(one.deviceEnvironment({0}),
            (Env{{"JAX_PLATFORMS", ""}, {"CUDA_VISIBLE_DEVICES", "0"}}));
  // No indexes: the platform decides which GPUs the replica sees.
  EXPECT_EQ(rc.deviceEnvironment({}), (Env{{"JAX_PLATFORMS", ""}}));
}

TEST(DeviceEnvironmentTest, GpuIndexesMustMatchTheDevice) {
  auto rc = ResourceConfig::withGpu("H100", 2);
  EXPECT_TRUE(contains(invalidArgument([&] { rc.deviceEnvironment({0}); }),
                       "a gpu H100x2 replica needs 2 distinct GPU indexes, got 0"));
  EXPECT_TRUE(contains(invalidArgument([&] {
                         rc.deviceEnvironment({0, 1, 2});
                       }),
                       "needs 2 distinct GPU indexes, got 0,1,2"));
  EXPECT_TRUE(contains(invalidArgument([&] {
                         rc.deviceEnvironment({1, 1});
                       }),
                       "needs 2 distinct GPU indexes, got 1,1"));
  auto cpu = ResourceConfig::withCpu(1);
  EXPECT_TRUE(contains(invalidArgument([&] { cpu.deviceEnvironment({0}); }),
                       "a cpu replica is given no GPUs, but got 1 GPU index(es)"));
  auto tpu = ResourceConfig::withTpu("v5p-8");
  EXPECT_TRUE(contains(invalidArgument([&] {
                         tpu.deviceEnvironment({0, 1});
                       }),
                       "a tpu replica is given no GPUs, but got 2 GPU index(es)"));
}

TEST(DeviceEnvironmentTest, TpuV5eV5pV6eGetLibtpuInitArgs) {
  const std::string flags = "--xla_tpu_enable_data_parallel_all_reduce_opt=true"
                            " --xla_tpu_data_parallel_opt_different_sized_ops=true"
                            " --xla_tpu_enable_async_collective_fusion=true"
                            " --xla_tpu_enable_async_collective_fusion_fuse_all_gather=true"
                            " --xla_tpu_enable_async_collective_fusion_multiple_steps=true"
                            " --xla_tpu_overlap_compute_collective_tc=true"
                            " --xla_enable_async_all_gather=true";
  EXPECT_EQ(str(jobs_detail::LIBTPU_INIT_ARGS_DEFAULT), flags);
  for (auto type : {"v5p-8", "v5litepod-16", "v5e-4", "v6e-256"}) {
    SCOPED_TRACE(type);
    EXPECT_EQ(ResourceConfig::withTpu(type).deviceEnvironment({}),
              (Env{{"JAX_PLATFORMS", ""}, {"LIBTPU_INIT_ARGS", flags}}));
  }
}

TEST(DeviceEnvironmentTest, TpuV4GetsNoLibtpuInitArgs) {
  EXPECT_EQ(ResourceConfig::withTpu("v4-32").deviceEnvironment({}), (Env{{"JAX_PLATFORMS", ""}}));
}

TEST(DeviceEnvironmentTest, UserValuesWin) {
  auto cpu = ResourceConfig::withCpu(1);
  EXPECT_EQ(cpu.deviceEnvironment({}, {{"JAX_PLATFORMS", "cuda"}}), Env{});
  // Even an empty user value wins; unrelated user variables change nothing.
  EXPECT_EQ(cpu.deviceEnvironment({}, {{"JAX_PLATFORMS", ""}, {"HOME", "/root"}}), Env{});
  EXPECT_EQ(cpu.deviceEnvironment({}, {{"HOME", "/root"}}), (Env{{"JAX_PLATFORMS", "cpu"}}));

  auto gpu = ResourceConfig::withGpu("H100", 2);
  EXPECT_EQ(gpu.deviceEnvironment({4, 5}, {{"CUDA_VISIBLE_DEVICES", "0,1"}}),
            (Env{{"JAX_PLATFORMS", ""}}));
  EXPECT_EQ(gpu.deviceEnvironment({4, 5}, {{"JAX_PLATFORMS", "cuda"}}),
            (Env{{"CUDA_VISIBLE_DEVICES", "4,5"}}));

  auto tpu = ResourceConfig::withTpu("v6e-8");
  Env own{{"LIBTPU_INIT_ARGS", "--xla_tpu_scoped_vmem_limit_kib=98304"}};
  EXPECT_EQ(tpu.deviceEnvironment({}, own), (Env{{"JAX_PLATFORMS", ""}}));
  EXPECT_EQ(tpu.deviceEnvironment({}, {{"LIBTPU_INIT_ARGS", ""}, {"JAX_PLATFORMS", "tpu"}}), Env{});
}

TEST(DeviceEnvironmentTest, UsesTheDeviceNotTheAlternatives) {
  auto rc = ResourceConfig::withTpu({"v4-8", "v5p-8"});
  EXPECT_EQ(rc.deviceEnvironment({}), (Env{{"JAX_PLATFORMS", ""}}));
  auto swapped = ResourceConfig::withTpu({"v5p-8", "v4-8"});
  EXPECT_EQ(swapped.deviceEnvironment({}).count("LIBTPU_INIT_ARGS"), 1u);
}

}  // namespace
}  // namespace troupe
