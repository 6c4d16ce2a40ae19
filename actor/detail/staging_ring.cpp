#include "troupe/actor/detail/staging_ring.h"

#include <algorithm>

#include <kj/debug.h>

namespace troupe::actor_detail {

StagingRing::StagingRing(std::shared_ptr<BlobDevice> device, size_t bufferBytes, size_t buffers)
    : device(kj::mv(device)), bufferBytes_(bufferBytes), capacity_(buffers) {
  KJ_REQUIRE(buffers > 0 && bufferBytes > 0, "a staging ring of no buffers", buffers, bufferBytes);
}

size_t StagingRing::buffersFor(size_t chunkBytes, uint64_t windowBytes) {
  chunkBytes = std::max<size_t>(chunkBytes, 1);
  uint64_t window = (windowBytes + chunkBytes - 1) / chunkBytes;
  uint64_t most = std::max<uint64_t>(MAX_BYTES / chunkBytes, 2);  // the sender picks the window
  return std::clamp<uint64_t>(window + 2, 2, std::min<uint64_t>(most, 64));
}

kj::Maybe<kj::Array<kj::byte>> StagingRing::tryTake() {
  kj::byte* at = nullptr;
  if (!idle.empty()) {
    at = idle.back();
    idle.pop_back();
  } else if (made < capacity_) {
    auto buffer = device->allocateStaging(bufferBytes_);
    KJ_REQUIRE(reinterpret_cast<uintptr_t>(buffer.begin()) % 8 == 0,
               "a staging buffer is not 8-byte aligned", device->name());
    at = buffer.begin();
    buffers.push_back(kj::mv(buffer));
    ++made;
  } else {
    return nullptr;
  }
  return kj::ArrayPtr<kj::byte>(at, bufferBytes_)
      .attach(kj::defer([self = kj::addRef(*this), at]() mutable { self->giveBack(at); }));
}

kj::Promise<kj::Array<kj::byte>> StagingRing::take() {
  KJ_IF_MAYBE(buffer, tryTake()) {
    return kj::mv(*buffer);
  }
  return freed.next().then([self = kj::addRef(*this)]() mutable { return self->take(); });
}

void StagingRing::giveBack(kj::byte* at) {
  idle.push_back(at);
  freed.notify();
}

}  // namespace troupe::actor_detail
