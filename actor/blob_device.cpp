#include "troupe/actor/blob_device.h"

#include "troupe/base/errors.h"

namespace troupe {

kj::Maybe<kj::Array<kj::byte>> BlobDevice::exportMemory(const kj::byte*, size_t) { return nullptr; }

kj::Array<const kj::byte> BlobDevice::importMemory(kj::ArrayPtr<const kj::byte>) {
  throwError(ErrorCode::UNIMPLEMENTED, kj::str(name(), " opens no memory of other processes"));
}

kj::Promise<void> BlobDevice::copyWithin(kj::byte*, const kj::byte*, size_t) {
  throwError(ErrorCode::UNIMPLEMENTED, kj::str(name(), " copies no memory device to device"));
}

}  // namespace troupe
