#pragma once
// The moving parts of blobs (blob.h): the bytes of one blob as they arrive (BlobSource), and
// their sending to a forest of members, each told whom to forward to (BlobFanout). A sender runs
// one BlobFanout over the whole blob; a receiver runs one over what it has received so far, for
// the members it forwards to.

#include <stdint.h>

#include <list>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <kj/array.h>
#include <kj/async.h>
#include <spdlog/logger.h>

#include "troupe/actor/blob.h"
#include "troupe/actor/blob_device.h"
#include "troupe/actor/detail/staging_ring.h"
#include "troupe/base/change_signal.h"
#include "troupe/base/event_loop.h"
#include "troupe/net/channel.h"
#include "troupe/schemas/blob.capnp.h"

namespace troupe::actor_detail {

// A copy of `result` (BlobResult holds a kj::Exception, which copies only by kj::cp).
BlobResult copyOf(const BlobResult& result);

// The XXH3-64 checksum chunks carry.
uint64_t blobChecksum(kj::ArrayPtr<const kj::byte> bytes);

// Copies `from` to `to` and returns blobChecksum(from), in one pass over the bytes: each step is
// hashed and then copied from the cache, with stores that bypass it where the CPU allows.
uint64_t copyWithChecksum(kj::byte* to, kj::ArrayPtr<const kj::byte> from);
// The same with memcpy and the SSE2 hash: what copyWithChecksum() does where the CPU has no AVX2.
uint64_t copyWithChecksumPortable(kj::byte* to, kj::ArrayPtr<const kj::byte> from);

// Bytes [0, available()) of a blob, in order, of which more may arrive. Refcounted: chunks on
// their way to a member hold it, so its memory lives until the last one is written. Loop thread
// only.
//
// A source in device memory (a BlobDevice's) is never touched by the CPU: its chunks go to the
// network through staging buffers (hostChunk()), and a receiver's come in through them
// (offerStaged()).
class BlobSource final : public kj::Refcounted {
public:
  // `memory` holds at least `size` bytes, the first `available` of them in place already (all
  // of them for a sender). `chunkBytes` divides the blob into chunks. `device`: the device
  // `memory` is on, or null for host memory; `windowBytes`, what senders keep in flight, sizes
  // its staging ring.
  BlobSource(kj::Array<const kj::byte> memory, uint64_t size, uint32_t chunkBytes,
             uint64_t available, std::shared_ptr<BlobDevice> device = nullptr,
             uint64_t windowBytes = 0);
  ~BlobSource() noexcept(false);

  uint64_t size() const { return size_; }
  uint64_t available() const { return available_; }
  uint32_t chunkBytes() const { return chunkBytes_; }
  uint64_t chunkCount() const { return (size_ + chunkBytes_ - 1) / chunkBytes_; }
  // Bytes in chunk `index`.
  uint64_t chunkSize(uint64_t index) const;

  // The device the memory is on, or null.
  const std::shared_ptr<BlobDevice>& device() const { return device_; }
  // The staging buffers of a device source (one chunk each).
  StagingRing& staging() { return *KJ_REQUIRE_NONNULL(ring); }

  // For a receiver, which allocated the memory writable: where chunks are copied to (a device
  // address for a device source).
  kj::byte* writable() { return const_cast<kj::byte*>(memory.begin()); }
  // Where the blob is in this process (a device address for a device source).
  const kj::byte* begin() const { return memory.begin(); }

  // The next chunk is in place and checked (its checksum given); waiters wake. For a device
  // source: checked in a staging buffer, on its way into the device (see resident()).
  void append(uint64_t checksum);
  // The next chunk is in place, copied there from the sender's memory (device to device, or
  // read from the sender's host memory) with no checksum: one is computed when it is first needed
  // (checksum(); for a device source, when it is first staged).
  void appendUnchecked();

  // Bytes [0, resident()) are in the memory itself: for a device source, copied into the
  // device (at most available()); for host memory, available().
  uint64_t resident() const { return device_ == nullptr ? available_ : resident_; }
  // The next `bytes` are in device memory now.
  void settle(uint64_t bytes);
  // Resolves once `bytes` bytes are resident; rejects once the source failed.
  kj::Promise<void> whenResident(uint64_t bytes);

  // The whole blob's device memory, exported for other processes on this host
  // (BlobDevice::exportMemory), once asked for; null where the device cannot, with why in
  // exportFailure() where it said.
  kj::Maybe<kj::ArrayPtr<const kj::byte>> exported();
  kj::Maybe<const kj::Exception&> exportFailure() const { return exportFailure_; }

  // The checksum of chunk `index`, which is in place: the one append() was given, or computed
  // now (once) for a source that came whole. A device source's is known once hostChunk() of it
  // resolved.
  uint64_t checksum(uint64_t index);

  // Gives the blob up: waits reject with `reason`, now and later.
  void fail(kj::Exception reason);
  kj::Maybe<const kj::Exception&> failure() const { return failure_; }

  // Resolves once `bytes` bytes are in place; rejects once the source failed.
  kj::Promise<void> whenAvailable(uint64_t bytes);

  // Bytes [offset, offset + length), which are in place, holding this source. For a device
  // source, device memory.
  kj::Array<const kj::byte> slice(uint64_t offset, uint64_t length);

  // Chunk `index`, which is in place, in host memory, holding this source: for host memory a
  // slice of it; for device memory a staging buffer holding a copy, shared by whoever asks while
  // one holds it (its checksum computed there, if not known).
  kj::Promise<kj::Array<const kj::byte>> hostChunk(uint64_t index);

  // A device source's receiver has chunk `index` in `staged` (a staging buffer of staging()),
  // checked, and copies it into the device: hostChunk() hands it out meanwhile. Returns it,
  // holding the offer; the chunk is no longer offered once every holder let go.
  kj::Array<const kj::byte> offerStaged(uint64_t index, kj::Array<const kj::byte> staged);

private:
  struct Staged;

  // Resolves once (this->*mark)() is at least `bytes`; rejects once the source failed.
  kj::Promise<void> whenReached(uint64_t (BlobSource::*mark)() const, uint64_t bytes);

  kj::Array<const kj::byte> memory;
  uint64_t size_;
  uint32_t chunkBytes_;
  uint64_t available_;
  std::vector<uint64_t> checksums;  // per chunk in place; 0 with `known` false: not computed
  std::vector<bool> known;
  kj::Maybe<kj::Exception> failure_;
  ChangeSignal grew;
  std::shared_ptr<BlobDevice> device_;
  uint64_t resident_;
  kj::Maybe<kj::Own<StagingRing>> ring;
  bool exportTried = false;
  kj::Maybe<kj::Array<kj::byte>> exported_;
  kj::Maybe<kj::Exception> exportFailure_;
  std::map<uint64_t, Staged*> staged;  // chunks in host memory now, by index (device only)
};

// A member to send to, and the members it forwards to in turn.
struct BlobHop {
  std::string endpoint;
  std::string address;
  std::string sameHostSocket;  // BlobTarget's
  std::string sameHostId;
  std::vector<BlobHop> children;
};

// What a fanout sends and how.
struct BlobParams {
  std::string name;
  uint64_t version = 0;
  uint64_t transfer = 0;  // random, the same at every hop
  uint32_t chunkBytes = 0;
  uint64_t windowBytes = 0;
  kj::Duration stallTimeout = 0 * kj::SECONDS;
  ChannelOptions channel;
  // Members on this host may read the chunks out of this process's memory
  // (BlobSendOptions::sameHostReads, which members forwarding the blob apply to theirs).
  bool sameHostReads = true;
};

// Most members one receiveBlob request may name.
// (A chain's members nest this deep: the forest is walked recursively.)
constexpr uint32_t MAX_BLOB_HOPS = 4096;

// The forest a receiveBlob request's flat list of hops describes. Throws INVALID_ARGUMENT for a
// list that is not one (a parent after its child), or longer than MAX_BLOB_HOPS.
std::vector<BlobHop> parseHops(capnp::List<schema::BlobHop>::Reader hops);

// `targets` laid out as a BlobSendOptions fanout says, in the order given.
std::vector<BlobHop> layOut(kj::ArrayPtr<const BlobTarget> targets, Fanout fanout,
                            uint32_t treeFanout);

// Sends `source` to every member of a forest of hops: to each root, telling it to forward to its
// children. A member that fails (cannot be reached, refuses, dies, stalls) gets an error outcome
// and its children are sent to directly instead, each from where it got to. Ends with an outcome
// for every member of the forest. Loop thread only. Refcounted (a transfer and the promises of
// its results hold it); destroying it cancels what runs and tells the members still receiving to
// give up (best effort).
class BlobFanout final : public kj::Refcounted, private kj::TaskSet::ErrorHandler {
public:
  BlobFanout(EventLoop& loop, kj::Own<BlobSource> source, BlobParams params,
             std::vector<BlobHop> roots, std::shared_ptr<spdlog::logger> log);
  ~BlobFanout() noexcept(false);
  KJ_DISALLOW_COPY(BlobFanout);

  // Resolves once every member has an outcome.
  kj::Promise<void> whenDone();
  bool done() const { return running.empty() && started; }

  // Every member's outcome so far, by endpoint name.
  const std::map<std::string, BlobResult>& outcomes() const { return outcomes_; }

  // Gives up everything still running: each member being sent to is told to give up (which it
  // passes on to those it forwards to), and every member without an outcome gets `reason`.
  void abort(const kj::Exception& reason);

  // The endpoints of the forest, in the order given.
  const std::vector<std::string>& endpoints() const { return endpoints_; }
  EventLoop& loop() { return loop_; }

private:
  class Hop;
  friend class Hop;

  void start(BlobHop hop);
  // `hop` ended: with the outcomes its member reported, or with `error` (then its children are
  // sent to directly).
  void ended(Hop& hop, kj::Maybe<kj::Exception> error, std::vector<BlobResult> reported);
  void record(BlobResult outcome);
  void taskFailed(kj::Exception&& exception) override;

  EventLoop& loop_;
  kj::Own<BlobSource> source;
  BlobParams params;
  std::shared_ptr<spdlog::logger> log;
  std::vector<std::string> endpoints_;
  std::map<std::string, std::string> addresses;  // by endpoint
  std::map<std::string, BlobResult> outcomes_;
  std::list<kj::Own<Hop>> running;
  bool started = false;
  ChangeSignal changed;
  kj::Own<kj::TaskSet> tasks;  // last: cancelled first
};

}  // namespace troupe::actor_detail
