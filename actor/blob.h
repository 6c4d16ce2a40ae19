#pragma once
// Blobs: large byte payloads (weights, tensors) streamed in chunks from one process to the
// ActorServers of others, into memory each receiver chooses, and forwarded from member to member
// so that a broadcast sends every byte once (ActorPool::broadcastBlob).
//
// Receiving, in a replica:
//
//   server.acceptBlobs(
//       "weights", [](const troupe::BlobHeader& h) { return troupe::allocateBlobMemory(h.size); },
//       [&](troupe::Blob b) { model.swapIn(b.version, kj::mv(b.bytes)); });
//
// Sending to servers named directly (a pool names its READY members):
//
//   auto sent = troupe::sendBlob(loop, {{"ps/ps-0", "tcp://10.0.0.1:4000"}}, "weights", 7,
//                                kj::mv(bytes), {.fanout = troupe::Fanout::CHAIN});
//   auto results = sent.waitAll(60 * kj::SECONDS).wait(ws);   // one BlobResult per target
//
// How it moves (schemas/blob.capnp): the sender asks each first-hop server to receive the blob
// (ActorHost.receiveBlob), naming the members that server forwards to in turn; the receiver calls
// the allocator, which may refuse, before any byte moves. Chunks of `chunkBytes` then go out in
// order, at most `windowBytes` unacknowledged per hop, each sent from the sender's own memory
// (no copy into a message) and copied once into the receiver's. A receiver forwards each chunk
// to its own children as soon as it has checked it, from its memory, so a CHAIN of N members
// takes about one transfer's time plus a chunk per hop.
//
// Integrity: every chunk carries its XXH3-64 checksum, checked by each receiver before it keeps
// the chunk; chunks are taken only in order, so a blob is handed to the handler only once every
// byte of it arrived and checked. A chunk that fails its checksum gives the transfer up at that
// member (BLOB_ABORTED), as a member that dies does: it frees what it held, and its parent sends
// to the members it would have forwarded to instead, from where each of them got to.
//
// Failures: a hop that makes no progress for `stallTimeout` is pinged; one that does not answer
// within another `stallTimeout` counts as failed. A member that fails (dies, refuses, stalls)
// gets an error result; its children still get the blob. A receiver whose sender disappears
// keeps what it has for its idle timeout, in case the sender's parent takes over, then frees it.

#include <stdint.h>

#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include <kj/array.h>
#include <kj/async.h>
#include <kj/function.h>
#include <kj/time.h>

#include "troupe/base/event_loop.h"
#include "troupe/net/channel.h"

namespace troupe {

class BlobDevice;  // blob_device.h

// What a sender is about to send, as a receiver's allocator sees it.
struct BlobHeader {
  std::string name;      // what the blob is ("weights"): the acceptBlobs() name
  uint64_t version = 0;  // the sender's version of it
  uint64_t size = 0;     // bytes
};

// A blob received whole, checked, and handed to the acceptBlobs() handler.
struct Blob {
  std::string name;
  uint64_t version = 0;
  // The memory the allocator returned, filled (its first `size` bytes). It may still be read
  // while the blob is forwarded to other members, so it is const; the allocator's array is
  // freed once the handler and every forward have let go of it.
  kj::Array<const kj::byte> bytes;
  // The device `bytes` are on (BlobAcceptOptions::device), or null for host memory.
  std::shared_ptr<BlobDevice> device;
};

// Returns memory of at least header.size bytes for the blob, or throws to refuse it (the sender
// gets BLOB_REFUSED with the message). Loop thread. What the memory holds after its transfer was
// given up is unspecified (chunks are checked as they are copied into it).
using BlobAllocator = kj::Function<kj::Array<kj::byte>(const BlobHeader& header)>;

// Memory for a blob of `size` bytes, for an allocator to return: where the blob is large (8 MiB
// or more) it is mapped on its own, 2 MiB-aligned and zeroed, and the kernel is asked for huge
// pages (MADV_HUGEPAGE), so that the first write to each 2 MiB costs one page fault rather than
// 512 (measured: bench/README.md, "Blobs"); smaller blobs come from the heap, as they are.
// Throws OVERLOADED when the system has not the memory now, INVALID_ARGUMENT for a size no
// memory holds (the sender then gets BLOB_REFUSED saying so). Any thread; the array may be
// dropped on any thread.
kj::Array<kj::byte> allocateBlobMemory(uint64_t size);

// Takes a blob once it is whole and checked. Loop thread; what it throws is the member's error
// in the sender's results.
using BlobHandler = kj::Function<void(Blob blob)>;

struct BlobAcceptOptions {
  // Blobs larger than this are refused before the allocator is asked. Default 64 GiB.
  uint64_t maxBytes = uint64_t{64} << 30;

  // A transfer that receives no chunk for this long is given up and its memory freed (its
  // sender died, or stalls); so is the record of a finished one. Default 30 s.
  kj::Duration idleTimeout = 30 * kj::SECONDS;

  // Whether a version at or below the last one handed over is taken. Default false: refused as
  // stale. (One transfer per name is received at a time whatever this says: a newer version
  // arriving gives up an older one still being received, and one not newer is refused.)
  bool acceptStaleVersions = false;

  // Called on the loop after each chunk a transfer receives, with the bytes in place so far (a
  // progress report). Default: none.
  kj::Maybe<kj::Function<void(const BlobHeader& header, uint64_t received)>> onProgress;

  // Called on the loop when a transfer is given up here before it was handed over: its sender
  // aborted it or went silent past idleTimeout, a chunk failed its checksum, a newer version
  // superseded it, or the server stopped. Its memory is freed once nothing refers to it any more.
  // Default: none (the server logs it either way).
  kj::Maybe<kj::Function<void(const BlobHeader& header, const kj::Exception& why)>> onGiveUp;

  // The device whose memory the allocator returns (blob_device.h), or null for host memory.
  // Chunks then come in through staging buffers in host memory, checked there and copied into
  // the device while the next ones arrive; the blob is handed over once all of it is there, and
  // forwarded to other members from there. Default: null.
  std::shared_ptr<BlobDevice> device;
};

// How a blob goes to several members.
enum class Fanout : uint8_t {
  STAR,   // the sender sends to each member
  CHAIN,  // the sender sends to the first, each member forwards to the next
  TREE,   // the sender sends to `treeFanout` members, each forwards to `treeFanout` more
};

struct BlobSendOptions {
  Fanout fanout = Fanout::STAR;  // Default STAR.
  uint32_t treeFanout = 2;       // children per member with Fanout::TREE (at least 1). Default 2.

  // Bytes per chunk (the last may be smaller); a multiple of 8 between 4 KiB and 64 MiB. Larger
  // chunks cost less CPU per byte, smaller ones let a chain's members forward sooner (each hop
  // adds a chunk's time). Default 4 MiB (measured: bench/README.md, "Blobs").
  uint32_t chunkBytes = 4u << 20;

  // Bytes each hop keeps sent and unacknowledged (at least one chunk is always allowed). Chunks
  // in flight are not copied: a larger window costs no memory on either side. Default 64 MiB.
  uint64_t windowBytes = uint64_t{64} << 20;

  // A hop that acknowledges nothing for this long is pinged, and given up if the ping is not
  // answered within as long again (at least 1 ms). Default 10 s.
  kj::Duration stallTimeout = 10 * kj::SECONDS;

  // Settings of the connections made to the members (credentials, connect timeout).
  ChannelOptions channel;

  // The device whose memory the bytes are in (blob_device.h), or null for host memory: chunks
  // are then copied out into staging buffers in host memory ahead of the network. The bytes
  // must be complete when the blob is sent: troupe's copies run on a stream of their own, so
  // wait for the work that wrote them first (for CUDA, synchronize its stream). A member on
  // this host copying from them device to device that fails may still be copying for up to
  // `stallTimeout` after its result: the array is held that long. Default: null.
  std::shared_ptr<BlobDevice> device;

  // Whether members on this host, reached through their same-host socket, may copy the chunks
  // straight out of this process's memory (process_vm_readv: one copy, and no work per byte for
  // the sender) rather than have them sent through the connection's shared memory. A member
  // reads where the kernel lets it (the same user; Yama's ptrace_scope, an undumpable sender or
  // a seccomp filter may forbid it) and its chunks come through shared memory where not. Such a
  // member hands the blob over only once the sender had its last answer. The array is held for
  // up to `stallTimeout` past a member's failure, and a read that ends later is not taken. Members
  // forwarding the blob apply the same to their copy. Host memory only. Default true.
  bool sameHostReads = true;
};

// A member to send to: its endpoint name (for results) and its server's address.
struct BlobTarget {
  std::string endpoint;
  std::string address;
  // The same-host socket its server publishes and that host's id (the endpoint's "troupe.unix"
  // and "troupe.host" metadata; empty for none): whoever sends to it from that host, the sender
  // or a member forwarding the blob, connects there and moves the chunks through shared memory
  // (README, "Same host").
  std::string sameHostSocket;
  std::string sameHostId;
};

// What became of a blob at one member.
struct BlobResult {
  std::string endpoint;
  std::string address;
  kj::Maybe<kj::Exception> error;  // why it does not have the blob (errors.h), or null
  uint64_t bytes = 0;              // bytes the member received
  // Of those, the bytes it copied straight from its sender's memory on their host, not through
  // the connection: device to device (CUDA IPC, blob_device.h) or read from the sender's host
  // memory (BlobSendOptions::sameHostReads). 0 where every chunk came through the connection.
  uint64_t pulledBytes = 0;
  // From the member's first request to its having the whole blob, as the member measured it;
  // until the error for a member that failed.
  kj::Duration latency = 0 * kj::NANOSECONDS;

  bool ok() const { return error == nullptr; }
};

namespace actor_detail {
class BlobFanout;
}

// A blob on its way to a set of members, as sendBlob() or ActorPool::broadcastBlob() started it.
// Belongs to the loop it was made on. Dropping it, and every promise it returned, gives the
// transfer up at every member still receiving it (they free what they hold).
class BlobTransfer {
public:
  BlobTransfer(BlobTransfer&&);
  BlobTransfer& operator=(BlobTransfer&&);
  ~BlobTransfer() noexcept(false);

  // How many members it goes to.
  size_t size() const;

  // Resolves once every member has the blob or has failed, or once `deadline` (from this call)
  // has passed, with one result per member in the order they were given (a pool's: by name).
  // At the deadline the transfer is given up where it is still running: those members get
  // DEADLINE_EXCEEDED, and are told to give up by a request that follows the chunks already on
  // their way to them (a member that stopped reading hears it once it reads again). The loop
  // writes it: a sender that lets its loop go before then leaves those members to their idle
  // timeout, as if it had died. Call it once.
  kj::Promise<kj::Array<BlobResult>> waitAll(kj::Duration deadline);

private:
  friend BlobTransfer sendBlob(EventLoop& loop, kj::ArrayPtr<const BlobTarget> targets,
                               kj::StringPtr name, uint64_t version,
                               kj::Array<const kj::byte> bytes, BlobSendOptions options);
  // `members`: the endpoint names, in the order results are given.
  BlobTransfer(kj::Own<actor_detail::BlobFanout> fanout, std::vector<std::string> members);

  kj::Own<actor_detail::BlobFanout> fanout;
  std::vector<std::string> members;
};

// Sends `bytes` as blob `name` at `version` to `targets` (1 to 4096, endpoint names and addresses
// unique), laid out as options.fanout says in the order given. Throws INVALID_ARGUMENT for bad
// options, a bad name (as an actor name), or targets outside those rules; everything else is in
// the results. The bytes are
// held until the transfer ends and must not change meanwhile. Loop thread.
BlobTransfer sendBlob(EventLoop& loop, kj::ArrayPtr<const BlobTarget> targets, kj::StringPtr name,
                      uint64_t version, kj::Array<const kj::byte> bytes,
                      BlobSendOptions options = {});
inline BlobTransfer sendBlob(EventLoop& loop, std::initializer_list<BlobTarget> targets,
                             kj::StringPtr name, uint64_t version, kj::Array<const kj::byte> bytes,
                             BlobSendOptions options = {}) {
  return sendBlob(loop, kj::arrayPtr(targets.begin(), targets.size()), name, version, kj::mv(bytes),
                  kj::mv(options));
}

}  // namespace troupe
