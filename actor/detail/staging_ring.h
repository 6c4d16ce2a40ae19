#pragma once
// A few staging buffers in host memory, of one size, through which a blob's chunks move between
// the network and a BlobDevice (blob_device.h). Buffers are allocated from the device as first
// needed, up to a count, and reused; a buffer taken is given back when its holder lets go.

#include <stddef.h>

#include <memory>
#include <vector>

#include <kj/array.h>
#include <kj/async.h>

#include "troupe/actor/blob_device.h"
#include "troupe/base/change_signal.h"

namespace troupe::actor_detail {

// A staging buffer taken from a ring, shared by whoever uses it at once: a message read into it
// and the write that takes it, or a copy out of the device and the chunk handed out.
struct StagingBuffer final : public kj::Refcounted {
  explicit StagingBuffer(kj::Array<kj::byte> bytes) : bytes(kj::mv(bytes)) {}
  kj::Array<kj::byte> bytes;
};

// Loop thread only. Refcounted: the buffers taken hold it.
class StagingRing final : public kj::Refcounted {
public:
  // Buffers of `bufferBytes`, at most `buffers` of them.
  StagingRing(std::shared_ptr<BlobDevice> device, size_t bufferBytes, size_t buffers);

  // How many buffers a ring for chunks of `chunkBytes` sent `windowBytes` at a time holds: a
  // window's worth and two more, so that the chunks a sender may have in flight can all be read
  // into one while the device copies others; at most 64, and at most MAX_BYTES of them (but 2),
  // since the window is the sender's to choose. (Made only as needed: where the device copies
  // faster than the network brings chunks, a few.)
  static size_t buffersFor(size_t chunkBytes, uint64_t windowBytes);
  static constexpr uint64_t MAX_BYTES = uint64_t{256} << 20;

  size_t bufferBytes() const { return bufferBytes_; }
  size_t capacity() const { return capacity_; }

  // A buffer, now if one is free (or may still be made), else null.
  kj::Maybe<kj::Array<kj::byte>> tryTake();
  // A buffer, once one is free. The promise holds the ring; dropping it takes none.
  kj::Promise<kj::Array<kj::byte>> take();

private:
  void giveBack(kj::byte* at);

  std::shared_ptr<BlobDevice> device;
  const size_t bufferBytes_;
  const size_t capacity_;
  size_t made = 0;
  std::vector<kj::Array<kj::byte>> buffers;  // every one made
  std::vector<kj::byte*> idle;               // those not taken
  ChangeSignal freed;
};

}  // namespace troupe::actor_detail
