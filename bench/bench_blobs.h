#pragma once
// What the blob benchmarks share (blob_bench, device_bench, bench_blob_member): the payload, and
// the device a member or sender keeps a blob in.

#include <stdint.h>
#include <string.h>

#include <memory>
#include <random>
#include <string>

#include <kj/array.h>
#include <kj/debug.h>

#include "troupe/actor/blob_device.h"
#include "troupe/base/event_loop.h"
#include "troupe/base/parse_number.h"
#include "tests/support/host_blob_device.h"

namespace troupe::bench {

// The payload, made once per size and kept: random bytes, every page touched.
inline kj::ArrayPtr<const kj::byte> payload(uint64_t size) {
  static kj::Array<kj::byte> bytes;
  if (bytes.size() != size) {
    bytes = nullptr;
    bytes = kj::heapArray<kj::byte>(size);
    std::mt19937_64 random(size);
    auto* words = reinterpret_cast<uint64_t*>(bytes.begin());
    for (uint64_t i = 0; i < size / 8; ++i) words[i] = random();
  }
  return bytes;
}

// `bytes` as a sender's blob, borrowed (the benchmark keeps them).
inline kj::Array<const kj::byte> borrowed(kj::ArrayPtr<const kj::byte> bytes) {
  return kj::Array<const kj::byte>(bytes.begin(), bytes.size(), kj::NullArrayDisposer::instance);
}

// The device `name` names for `loop`: "cuda:N", or "host" for host memory standing in for one
// (tests/support/host_blob_device.h). Throws for anything else.
inline std::shared_ptr<BlobDevice> deviceNamed(EventLoop& loop, const std::string& name) {
  if (name == "host") return std::make_shared<test::HostBlobDevice>(loop);
  kj::Maybe<uint64_t> ordinal;
  if (name.rfind("cuda:", 0) == 0) {
    ordinal = parseWholeNumber(kj::StringPtr(name.c_str() + strlen("cuda:")), INT32_MAX);
  }
  KJ_IF_MAYBE(n, ordinal) {
    return cudaBlobDevice(loop, static_cast<int>(*n));
  }
  KJ_FAIL_REQUIRE("a device is cuda:N or host", name);
}

}  // namespace troupe::bench
