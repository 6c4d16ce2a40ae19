#include "troupe/actor/detail/blob_receiver.h"

#include <string.h>

#include <algorithm>
#include <atomic>

#include <capnp/rpc.capnp.h>
#include <capnp/serialize.h>
#include <kj/debug.h>

#include "troupe/actor/detail/blob_fanout.h"
#include "troupe/actor/detail/sender_memory.h"
#include "troupe/actor/endpoint.h"
#include "troupe/base/change_signal.h"
#include "troupe/base/errors.h"
#include "troupe/net/same_host.h"

namespace troupe::actor_detail {

namespace {

constexpr uint32_t MIN_CHUNK_BYTES = 4096;
constexpr uint32_t MAX_CHUNK_BYTES = 64u << 20;

kj::String describe(const BlobHeader& h) {
  return kj::str("blob '", printable(h.name), "' v", h.version, " (", h.size, " bytes)");
}

}  // namespace

struct BlobReceiver::Acceptor {
  std::string name;
  BlobAllocator allocate;
  BlobHandler handle;
  BlobAcceptOptions options;
  kj::Maybe<uint64_t> delivered;                    // the newest version handed over
  std::map<uint64_t, kj::Own<Transfer>> transfers;  // by transfer id
};

// One blob being received (or received and remembered for a while, for a sender that resumes
// it to ask how it went). Refcounted: its sinks hold it.
class BlobReceiver::Transfer final : public kj::Refcounted {
public:
  Transfer(BlobReceiver& receiver, Acceptor& acceptor, BlobHeader header, BlobParams params,
           kj::Own<BlobSource> source, std::vector<BlobHop> children)
      : receiver(&receiver),
        acceptor(&acceptor),
        loop(receiver.loop),
        log(receiver.log),
        who(receiver.who()),
        header(kj::mv(header)),
        id(params.transfer),
        params(params),
        openedAt(loop.timer().now()),
        lastActivity(openedAt),
        source(kj::mv(source)),
        idle(nullptr) {
    if (!children.empty()) {
      forward = kj::refcounted<BlobFanout>(loop, kj::addRef(*this->source), kj::mv(params),
                                           kj::mv(children), log);
    }
    idle = watchIdle().eagerlyEvaluate(nullptr);
    receiver.byId[id] = this;
    if (this->header.size == 0) deliver();
  }

  ~Transfer() noexcept(false) {
    if (receiver == nullptr) return;
    auto at = receiver->byId.find(id);
    if (at != receiver->byId.end() && at->second == this) receiver->byId.erase(at);
  }

  // The receiver goes (its server is destroyed) while something still holds this transfer: it
  // has been given up, and touches the receiver no more.
  void orphan() {
    receiver = nullptr;
    acceptor = nullptr;
    idle = nullptr;
  }

  // The memory chunk `offset` of `words` words is to be read into, when it is the next one not
  // placed yet and fits there exactly: for SegmentPlacement.
  kj::Maybe<kj::Array<capnp::word>> placeChunk(uint64_t offset, size_t words) {
    if (failure != nullptr || delivered || resuming || source.get() == nullptr) return nullptr;
    auto& s = *source;
    if (offset != placedUpTo || offset >= s.size()) return nullptr;
    uint64_t length = s.chunkSize(offset / s.chunkBytes());
    if (length != words * sizeof(capnp::word)) return nullptr;
    kj::byte* at = nullptr;
    kj::Maybe<kj::Own<StagingBuffer>> buffer;
    if (s.device() == nullptr) {
      at = s.writable() + offset;
      if (reinterpret_cast<uintptr_t>(at) % sizeof(capnp::word) != 0) return nullptr;
    } else {
      // Device memory: read into a staging buffer, unless a write waits for one.
      if (starved) return nullptr;
      KJ_IF_MAYBE(b, s.staging().tryTake()) {
        auto staged = kj::refcounted<StagingBuffer>(kj::mv(*b));
        at = staged->bytes.begin();
        stagedReads[offset] = kj::addRef(*staged);
        buffer = kj::mv(staged);
      } else {
        return nullptr;
      }
    }
    placedUpTo += length;
    ++placementsOut;
    auto hold = kj::defer([self = kj::addRef(*this)]() mutable {
      if (--self->placementsOut == 0) self->placementsDone.notify();
    });
    return kj::ArrayPtr<capnp::word>(reinterpret_cast<capnp::word*>(at), words)
        .attach(kj::addRef(s), kj::mv(hold), kj::mv(buffer));
  }

  // A new sender resumes the transfer. Resolves, with the sink it writes into, once no message
  // is being read into the blob's memory any more (none is placed meanwhile), so that no stale
  // read lands on bytes the new sender's chunks fill and check; chunks are then placed again
  // from where the transfer got to, and the sinks handed out before are superseded.
  kj::Promise<capnp::Capability::Client> resume() {
    resuming = true;
    auto settled = whenNotPlacing().then([this]() { return staging.addBranch(); });
    return settled.then([self = kj::addRef(*this)]() mutable -> capnp::Capability::Client {
      auto& t = *self;
      t.resuming = false;
      t.placedUpTo = t.received();
      t.due = t.received();
      t.stagedReads.clear();
      ++t.generation;
      t.touch();
      return t.newSink(kj::mv(self));
    });
  }

  // The sink of the current generation.
  static capnp::Capability::Client newSink(kj::Own<Transfer> transfer);

  // Whether the sender of the current generation lets this member copy the chunks from its
  // memory, and this member can: from its device memory (`h`'s deviceMemory) into ours, or from
  // its host memory by reading it (readFrom()). Then this member opens that memory, and takes
  // `pulled` writes from then on. Otherwise chunks come in writes.
  bool pullFrom(schema::BlobHeader::Reader h, std::shared_ptr<const LocalPeer> peer) {
    imported = nullptr;
    senderMemory = nullptr;
    readFailure = nullptr;
    if (!inProgress() || source.get() == nullptr) return false;  // handed over, or given up
    auto& s = *source;
    auto device = s.device();
    if (device == nullptr) return readFrom(h, kj::mv(peer));
    if (!h.hasDeviceMemory() || h.getDeviceHost().size() == 0 ||
        h.getDeviceHost() != sameHostId().c_str()) {
      return false;
    }
    KJ_IF_MAYBE(e, kj::runCatchingExceptions([&]() {
                  auto memory = device->importMemory(h.getDeviceMemory());
                  KJ_REQUIRE(memory.size() >= header.size, "the memory is smaller than the blob");
                  imported = kj::refcounted<Imported>(kj::mv(memory));
                })) {
      log->info("{}: {} comes through host memory: {} cannot open the sender's memory: {}",
                who.cStr(), describe(header).cStr(), device->name().cStr(),
                e->getDescription().cStr());
      return false;
    }
    return true;
  }

  // Host memory: whether the sender of the current generation lets this member read the chunks
  // out of its memory (`h`'s senderMemory), and this member can: the sender is the process at
  // the other end of the connection (`peer`, as the kernel knows it: no client can have another
  // process's memory read), and the kernel allows the reads.
  bool readFrom(schema::BlobHeader::Reader h, std::shared_ptr<const LocalPeer> peer) {
    if (h.getSenderPid() == 0) return false;  // not offered
    kj::String why;
    if (peer == nullptr) {
      why = kj::str("the connection's peer is not a process of this user here");
    } else if (static_cast<pid_t>(h.getSenderPid()) != peer->pid) {
      why = kj::str("the sender names process ", h.getSenderPid(), ", the connection's peer is ",
                    peer->pid);
    } else {
      KJ_IF_MAYBE(m, SenderMemory::open(kj::mv(peer), h.getSenderMemory(), header.size, why)) {
        senderMemory = kj::mv(*m);
        return true;
      }
    }
    // Said once a process at info (it is how the host is set up, and holds for every blob).
    static std::atomic<bool> said{false};
    log->log(said.exchange(true) ? spdlog::level::debug : spdlog::level::info,
             "{}: {} comes through the connection, not read from the sender's memory: {}",
             who.cStr(), describe(header).cStr(), why.cStr());
    return false;
  }

  uint64_t generation = 0;  // of the sink that may write now

  // Whether a request to resume this transfer describes the same blob.
  bool sameBlob(const BlobHeader& h, uint32_t chunkBytes) const {
    return h.version == header.version && h.size == header.size && chunkBytes == params.chunkBytes;
  }

  bool inProgress() const { return failure == nullptr && !delivered; }
  bool handedOver() const { return delivered; }
  uint64_t version() const { return header.version; }
  uint64_t received() const {
    if (delivered) return header.size;
    return source.get() == nullptr ? 0 : source->available();
  }
  kj::Maybe<const kj::Exception&> failed() const { return failure; }
  void touch() { lastActivity = loop.timer().now(); }

  // Takes the chunk at `offset`; resolves once it is in place (for device memory: in a staging
  // buffer, on its way into the device).
  kj::Promise<void> write(uint64_t transfer, uint64_t offset, capnp::Data::Reader data,
                          uint64_t checksum, bool pulled, int64_t heldUntil) {
    KJ_IF_MAYBE(e, failure) {
      kj::throwFatalException(kj::cp(*e));
    }
    if (transfer != id) {
      giveUp(kj::str("a chunk of transfer ", transfer, " came to the sink of transfer ", id));
    }
    if (delivered) {
      giveUp(kj::str("a chunk at byte ", offset, " after the whole blob arrived"));
    }
    auto& s = *source;
    KJ_IF_MAYBE(e, readFailure) {
      // A chunk of the sender's memory could not be read: neither are those after it (until
      // another sender resumes the transfer).
      if (pulled) kj::throwFatalException(kj::cp(*e));
    }
    if (offset != due) {
      giveUp(kj::str("the chunk at byte ", offset, " came when byte ", due, " was due"));
    }
    uint64_t index = offset / s.chunkBytes();
    if (pulled) return pull(index, heldUntil);
    if (data.size() != s.chunkSize(index)) {
      giveUp(kj::str("the chunk at byte ", offset, " holds ", data.size(), " bytes, not ",
                     s.chunkSize(index)));
    }
    if (s.device() != nullptr) {
      if (blobChecksum(data) != checksum) failedChecksum(offset);
      taken(data.size());
      return stage(index, data, checksum);
    }
    auto* at = s.writable() + offset;
    if (data.begin() != at) {
      // Copied, not placed: no read may still be landing on these bytes.
      if (placementsOut > 0 && placedUpTo > offset) {
        giveUp(
            kj::str("the chunk at byte ", offset, " came while another was read into its place"));
      }
      // Checked as it is copied: bytes past available() are no one's until appended() below.
      if (copyWithChecksum(at, data) != checksum) failedChecksum(offset);
    } else if (blobChecksum(data) != checksum) {
      failedChecksum(offset);
    }
    taken(data.size());
    appended(checksum);
    if (s.available() == s.size() && !readSender) deliver();
    return kj::READY_NOW;
  }

  // Resolves, once this member handed the blob over and every member it forwards to finished,
  // with this member's outcome (unnamed) and theirs.
  kj::Promise<std::vector<BlobResult>> finish() {
    if (!delivered && failure == nullptr && readSender && source->available() == header.size) {
      // Chunks were read from a sender's memory: only now, with every answer received while the
      // sender held that memory, are they surely the blob's.
      deliver();
    }
    if (!delivered && failure == nullptr && due == header.size) {
      // Every chunk came; the last are on their way into the device.
      return handedOver_.next().then([this]() { return finish(); });
    }
    if (!delivered) {
      KJ_IF_MAYBE(e, failure) {
        return kj::cp(*e);
      }
      giveUp(kj::str("the sender finished after ", source->available(), " of ", header.size,
                     " bytes"));
    }
    touch();
    kj::Promise<void> forwarded = kj::READY_NOW;
    KJ_IF_MAYBE(f, forward) {
      forwarded = (*f)->whenDone();
    }
    return forwarded.then([this]() {
      touch();
      releaseIfDone();
      std::vector<BlobResult> outcomes;
      BlobResult own;
      own.bytes = header.size;
      own.pulledBytes = pulledBytes;
      own.latency = took;
      own.error = handlerFailure.map([](const kj::Exception& e) { return kj::cp(e); });
      outcomes.push_back(kj::mv(own));
      KJ_IF_MAYBE(f, forward) {
        for (auto& name : (*f)->endpoints()) {
          auto at = (*f)->outcomes().find(name);
          if (at != (*f)->outcomes().end()) outcomes.push_back(copyOf(at->second));
        }
      }
      return outcomes;
    });
  }

  // The sender of the current generation let go of its sink: its device memory, if this member
  // opened it, is closed once the copies from it in flight end.
  void senderGone() {
    imported = nullptr;
    senderMemory = nullptr;
  }

  // Resolves once the chunks taken so far are done with: copies into the device memory and out
  // of a sender's have ended (an abort answers then, so that the sender's memory outlives them).
  kj::Promise<void> whenSettled() { return staging.addBranch(); }

  // Gives the transfer up here and at the members it forwards to, and frees the memory (once
  // chunks on their way out let go of it).
  void abort(kj::Exception reason) {
    if (failure != nullptr) return;
    failure = kj::cp(reason);
    KJ_IF_MAYBE(f, forward) {
      (*f)->abort(reason);
    }
    if (!delivered) {
      log->warn("{}: {} given up after {} bytes: {}", who.cStr(), describe(header).cStr(),
                source->available(), reason.getDescription().cStr());
      if (acceptor != nullptr) {
        KJ_IF_MAYBE(gaveUp, acceptor->options.onGiveUp) {
          KJ_IF_MAYBE(e, kj::runCatchingExceptions([&]() { (*gaveUp)(header, reason); })) {
            log->error("{}: the onGiveUp callback of {} threw: {}", who.cStr(),
                       describe(header).cStr(), e->getDescription().cStr());
          }
        }
      }
      source->fail(kj::mv(reason));
    }
    source = nullptr;
    stagedReads.clear();
    imported = nullptr;  // copies still running hold it
    senderMemory = nullptr;
    handedOver_.notify();
    forget();
  }

private:
  // The sender's device memory, opened in this process; copies from it hold it.
  struct Imported final : public kj::Refcounted {
    explicit Imported(kj::Array<const kj::byte> memory) : memory(kj::mv(memory)) {}
    kj::Array<const kj::byte> memory;
  };

  // Chunk `index` is in place in the sender's memory. Device to device: it is copied from there
  // into ours; resolves once it is there (after the chunks before it). Host memory: it is read
  // now (read()).
  kj::Promise<void> pull(uint64_t index, int64_t heldUntil) {
    auto& s = *source;
    uint64_t length = s.chunkSize(index);
    uint64_t offset = index * s.chunkBytes();
    if (s.device() == nullptr) {
      read(offset, length, heldUntil);
      return kj::READY_NOW;
    }
    Imported* from = nullptr;
    KJ_IF_MAYBE(i, imported) {
      from = i->get();
    }
    if (from == nullptr) giveUp(kj::str("a chunk to copy from a memory this member never opened"));
    taken(length);
    pulledBytes += length;
    auto copied = kj::evalNow([&]() {
      return s.device()->copyWithin(s.writable() + offset, from->memory.begin() + offset, length);
    });
    // The copy runs to its end whatever becomes of the transfer, holding both memories.
    auto done = copied.attach(kj::addRef(s), kj::addRef(*from)).fork();
    done.addBranch().detach([](kj::Exception&&) {});
    return enchain([this, copy = done.addBranch(), length]() mutable {
      return copy.then([this, length]() {
        if (source.get() == nullptr) return;  // given up meanwhile
        source->appendUnchecked();
        source->settle(length);
        progressed();
        if (source->resident() == header.size) deliver();
      });
    });
  }

  // Host memory: the chunk at `offset` is read from the sender's memory into ours (by `heldUntil`,
  // the sender's word). A read that fails for want of the sender (it exited, or its hold on the
  // memory ended first) fails its write and the reads after it, not the transfer: another sender
  // may resume it from here. Any other failure gives the transfer up.
  void read(uint64_t offset, uint64_t length, int64_t heldUntil) {
    SenderMemory* from = nullptr;
    KJ_IF_MAYBE(m, senderMemory) {
      from = m->get();
    }
    if (from == nullptr) giveUp(kj::str("a chunk to read from a memory this member never opened"));
    KJ_IF_MAYBE(e, kj::runCatchingExceptions([&]() {
                  from->read(source->writable() + offset, offset, length, heldUntil);
                })) {
      if (errorCode(*e) != ErrorCode::DISCONNECTED) {
        // Not for want of the sender: the transfer is given up, and its memory freed.
        giveUp(kj::str(e->getDescription()));
      }
      readFailure = kj::cp(*e);
      kj::throwFatalException(kj::mv(*e));
    }
    readSender = true;
    if (receiver != nullptr) receiver->bytesRead += length;
    pulledBytes += length;
    taken(length);
    source->appendUnchecked();
    progressed();
  }

  // Runs `step` after the steps before it (stage() and pull() keep chunks in order); a step
  // that fails gives the transfer up, and the chain goes on. Resolves once it ran; rejects when
  // the transfer was given up.
  kj::Promise<void> enchain(kj::Function<kj::Promise<void>()> step) {
    auto next = staging.addBranch()
                    .then([step = kj::mv(step)]() mutable { return step(); })
                    .catch_([this](kj::Exception&& e) {
                      if (inProgress()) {
                        abort(makeError(ErrorCode::BLOB_ABORTED,
                                        kj::str(describe(header), ": ", e.getDescription())));
                      }
                    });
    auto forked = next.fork();
    auto result = forked.addBranch().then([self = kj::addRef(*this)]() {
      KJ_IF_MAYBE(e, self->failure) {
        kj::throwFatalException(kj::cp(*e));
      }
    });
    staging = kj::mv(forked);
    return result;
  }

  // The chunk due, `length` bytes, is taken: the next is due after it, and none is read into
  // its place any more.
  void taken(uint64_t length) {
    due += length;
    placedUpTo = std::max(placedUpTo, due);
  }

  // The next chunk is in place and checked: counts it, tells the progress callback.
  void appended(uint64_t checksum) {
    source->append(checksum);
    progressed();
  }

  void progressed() {
    auto& s = *source;
    touch();
    KJ_IF_MAYBE(progress, acceptor->options.onProgress) {
      KJ_IF_MAYBE(e, kj::runCatchingExceptions([&]() { (*progress)(header, s.available()); })) {
        log->error("{}: the onProgress callback of {} threw: {}", who.cStr(),
                   describe(header).cStr(), e->getDescription().cStr());
      }
    }
  }

  // Device memory: chunk `index` (`data`, checked) goes into a staging buffer, after the chunks
  // before it, and from there into the device. Resolves once it is staged.
  kj::Promise<void> stage(uint64_t index, capnp::Data::Reader data, uint64_t checksum) {
    kj::Maybe<kj::Array<const kj::byte>> staged;
    uint64_t offset = index * source->chunkBytes();
    auto read = stagedReads.find(offset);
    if (read != stagedReads.end()) {
      auto& buffer = read->second;
      if (buffer->bytes.begin() == data.begin()) {
        staged = kj::ArrayPtr<const kj::byte>(data.begin(), data.size()).attach(kj::mv(buffer));
      }
      stagedReads.erase(read);
    }
    kj::Maybe<kj::Array<kj::byte>> copy;  // when not read into a staging buffer: kept till one
    if (staged == nullptr) copy = kj::heapArray<kj::byte>(data);
    return enchain([this, index, checksum, staged = kj::mv(staged),
                    copy = kj::mv(copy)]() mutable -> kj::Promise<void> {
      if (source.get() == nullptr) return kj::READY_NOW;  // given up meanwhile
      KJ_IF_MAYBE(bytes, staged) {
        intoDevice(index, checksum, kj::mv(*bytes));
        return kj::READY_NOW;
      }
      auto bytes = KJ_ASSERT_NONNULL(kj::mv(copy));
      auto& ring = source->staging();
      kj::Promise<kj::Array<kj::byte>> buffer = nullptr;
      KJ_IF_MAYBE(free, ring.tryTake()) {
        buffer = kj::mv(*free);
      } else {
        starved = true;  // no more reads into staging buffers till this one has one
        buffer = ring.take();
      }
      return buffer.then(
          [this, index, checksum, bytes = kj::mv(bytes)](kj::Array<kj::byte> buffer) mutable {
            starved = false;
            if (source.get() == nullptr) return;
            memcpy(buffer.begin(), bytes.begin(), bytes.size());
            intoDevice(index, checksum, buffer.slice(0, bytes.size()).attach(kj::mv(buffer)));
          });
    });
  }

  // Device memory: chunk `index` is checked in `bytes`, a staging buffer. Forwards may send it
  // from there while the device copies it into place; the blob is handed over once the last
  // copy is done.
  void intoDevice(uint64_t index, uint64_t checksum, kj::Array<const kj::byte> bytes) {
    auto& s = *source;
    auto offered = s.offerStaged(index, kj::mv(bytes));
    appended(checksum);
    auto* to = s.writable() + index * s.chunkBytes();
    auto copied = s.device()->copyIn(to, offered.begin(), offered.size());
    // Runs to its end whatever becomes of the transfer: the copy holds the staging buffer and,
    // through it, the device memory.
    copied
        .then(
            [self = kj::addRef(*this), offered = kj::mv(offered)]() mutable {
              auto& t = *self;
              if (!t.inProgress() || t.source.get() == nullptr) return;
              t.source->settle(offered.size());
              if (t.source->resident() == t.header.size) t.deliver();
            },
            [self = kj::addRef(*this),
             device = kj::str(s.device()->name())](kj::Exception&& e) mutable {
              if (self->inProgress()) {
                self->abort(makeError(ErrorCode::BLOB_ABORTED,
                                      kj::str(describe(self->header), ": the copy into ", device,
                                              " failed: ", e.getDescription())));
              }
            })
        .detach([](kj::Exception&&) {});
  }

  // Aborts with BLOB_ABORTED (`why`) and throws it.
  [[noreturn]] void giveUp(kj::String why) {
    auto e = makeError(ErrorCode::BLOB_ABORTED, kj::str(describe(header), ": ", why));
    abort(kj::cp(e));
    kj::throwFatalException(kj::mv(e));
  }

  [[noreturn]] void failedChecksum(uint64_t offset) {
    giveUp(kj::str("the chunk at byte ", offset, " failed its checksum"));
  }

  // Once the blob is handed over and forwarded, the transfer lets go of its memory (the handler
  // may still hold it).
  void releaseIfDone() {
    if (!delivered) return;
    KJ_IF_MAYBE(f, forward) {
      if (!(*f)->done()) return;
    }
    source = nullptr;
  }

  void deliver() {
    delivered = true;
    imported = nullptr;  // the sender's memory: every copy from it is done
    senderMemory = nullptr;
    took = loop.timer().now() - openedAt;
    KJ_IF_MAYBE(v, acceptor->delivered) {
      if (header.version > *v) *v = header.version;
    } else {
      acceptor->delivered = header.version;
    }
    log->debug("{}: received {} in {} ms", who.cStr(), describe(header).cStr(),
               took / kj::MILLISECONDS);
    Blob blob{header.name, header.version, source->slice(0, header.size), source->device()};
    KJ_IF_MAYBE(e, kj::runCatchingExceptions([&]() { acceptor->handle(kj::mv(blob)); })) {
      log->error("{}: the handler of {} failed: {}", who.cStr(), describe(header).cStr(),
                 e->getDescription().cStr());
      handlerFailure = makeError(ErrorCode::FAILED,
                                 kj::str("the receiver's handler of ", describe(header),
                                         " failed: ", e->getDescription()));
    }
    releaseIfDone();
    handedOver_.notify();
  }

  // Resolves when the transfer has been idle for the acceptor's idle timeout: then an unfinished
  // transfer is given up, and a finished one forgotten (unless it still forwards).
  kj::Promise<void> watchIdle() {
    auto timeout = acceptor->options.idleTimeout;
    return loop.timer().atTime(lastActivity + timeout).then([this, timeout]() {
      auto now = loop.timer().now();
      bool forwarding = false;
      KJ_IF_MAYBE(f, forward) {
        forwarding = !(*f)->done();
      }
      if (now < lastActivity + timeout || (delivered && forwarding)) {
        if (forwarding) touch();
        return watchIdle();
      }
      releaseIfDone();
      if (inProgress()) {
        abort(makeError(ErrorCode::BLOB_ABORTED,
                        kj::str(describe(header), ": no chunk for ", timeout / kj::MILLISECONDS,
                                " ms (the sender is gone or stalls)")));
      } else {
        forget();
      }
      return kj::Promise<void>(kj::READY_NOW);
    });
  }

  // Drops the acceptor's record of this transfer, on a later turn (this may run inside one of
  // its own promises).
  void forget() {
    if (acceptor == nullptr) return;
    auto at = acceptor->transfers.find(id);
    if (at == acceptor->transfers.end() || at->second.get() != this) return;
    receiver->tasks->add(kj::evalLater([gone = kj::mv(at->second)]() {}));
    acceptor->transfers.erase(at);
  }

  BlobReceiver* receiver;  // null once orphaned
  Acceptor* acceptor;      // null once orphaned
  EventLoop& loop;
  std::shared_ptr<spdlog::logger> log;
  const kj::String who;  // the server, for log lines
  const BlobHeader header;
  const uint64_t id;
  const BlobParams params;
  const kj::TimePoint openedAt;
  kj::TimePoint lastActivity;
  kj::Duration took = 0 * kj::SECONDS;
  kj::Own<BlobSource> source;  // null once given up, or handed over and forwarded
  uint64_t placedUpTo = 0;     // chunks below this were placed (or written): see placeChunk()
  uint64_t due = 0;            // the offset of the next chunk to be written
  uint64_t pulledBytes = 0;    // copied from senders' memory (pull()), not written
  // Device memory only.
  // The sender's device memory, opened: chunks are copied from there (pull()).
  kj::Maybe<kj::Own<Imported>> imported;
  std::map<uint64_t, kj::Own<StagingBuffer>> stagedReads;  // chunks read into staging, by offset
  // Host memory only.
  // The sender's memory, where it lets this member read the chunks from there (read()).
  kj::Maybe<kj::Own<SenderMemory>> senderMemory;
  bool readSender = false;  // a chunk came from a sender's memory: handed over at finish()
  kj::Maybe<kj::Exception> readFailure;  // why the current sender's memory could not be read
  kj::ForkedPromise<void> staging = kj::Promise<void>(kj::READY_NOW).fork();  // the last stage()
  bool starved = false;        // a chunk waits for a staging buffer: none is read into meanwhile
  ChangeSignal handedOver_;    // delivered, or given up
  uint32_t placementsOut = 0;  // messages being read into the blob's memory, or not yet served
  ChangeSignal placementsDone;
  bool resuming = false;  // a new sender waits for placements to end: none is made

  kj::Promise<void> whenNotPlacing() {
    if (placementsOut == 0) return kj::READY_NOW;
    return placementsDone.next().then([this]() { return whenNotPlacing(); });
  }
  kj::Maybe<kj::Own<BlobFanout>> forward;
  bool delivered = false;
  kj::Maybe<kj::Exception> failure;         // given up
  kj::Maybe<kj::Exception> handlerFailure;  // handed over, and the handler threw
  kj::Promise<void> idle;
};

namespace {

// What a sender writes into. Holds its transfer; only the sink handed out last writes.
class BlobSinkImpl final : public schema::BlobSink::Server {
public:
  using Transfer = BlobReceiver::Transfer;
  BlobSinkImpl(kj::Own<Transfer> transfer, uint64_t generation)
      : transfer(kj::mv(transfer)), generation(generation) {}
  ~BlobSinkImpl() noexcept(false) {
    // Its sender let go (finished, or gone): no chunk comes from its memory any more.
    if (!superseded()) transfer->senderGone();
  }

protected:
  kj::Promise<void> write(WriteContext context) override {
    if (superseded()) {
      context.getResults().setSuperseded(true);
      return kj::READY_NOW;
    }
    auto params = context.getParams();
    return transfer->write(params.getTransfer(), params.getOffset(), params.getData(),
                           params.getChecksum(), params.getPulled(), params.getHeldUntil());
  }

  kj::Promise<void> finish(FinishContext context) override {
    if (superseded()) {
      context.getResults().setSuperseded(true);
      return kj::READY_NOW;
    }
    return transfer->finish().then([context](std::vector<BlobResult> outcomes) mutable {
      auto list = context.getResults().initOutcomes(outcomes.size());
      for (uint i = 0; i < outcomes.size(); ++i) {
        auto& o = outcomes[i];
        auto out = list[i];
        out.setEndpoint(o.endpoint);
        out.setOk(o.ok());
        KJ_IF_MAYBE(e, o.error) {
          out.setError(e->getDescription());
          out.setErrorType(static_cast<uint8_t>(e->getType()));
        }
        out.setBytes(o.bytes);
        out.setPulled(o.pulledBytes);
        out.setMicros(static_cast<uint64_t>(o.latency / kj::MICROSECONDS));
      }
    });
  }

  kj::Promise<void> abort(AbortContext context) override {
    if (superseded()) return kj::READY_NOW;
    transfer->abort(
        makeError(ErrorCode::BLOB_ABORTED,
                  kj::str("aborted by its sender: ", printable(context.getParams().getReason()))));
    return transfer->whenSettled();
  }

private:
  bool superseded() const { return transfer->generation != generation; }

  kj::Own<Transfer> transfer;
  const uint64_t generation;
};

[[noreturn]] void refuse(kj::StringPtr why) { throwError(ErrorCode::BLOB_REFUSED, why); }

}  // namespace

capnp::Capability::Client BlobReceiver::Transfer::newSink(kj::Own<Transfer> transfer) {
  auto generation = transfer->generation;
  return kj::heap<BlobSinkImpl>(kj::mv(transfer), generation);
}

// ---------------------------------------------------------------------------------------------

BlobReceiver::BlobReceiver(EventLoop& loop, ChannelOptions forwarding,
                           std::shared_ptr<spdlog::logger> log, kj::Function<kj::String()> who)
    : loop(loop),
      forwarding(kj::mv(forwarding)),
      log(kj::mv(log)),
      who(kj::mv(who)),
      tasks(kj::heap<kj::TaskSet>(static_cast<kj::TaskSet::ErrorHandler&>(*this))) {}

void BlobReceiver::stop() {
  for (auto& [name, acceptor] : acceptors) {
    auto transfers = kj::mv(acceptor->transfers);
    for (auto& [id, transfer] : transfers) {
      transfer->abort(makeError(ErrorCode::BLOB_ABORTED, "the receiving server stopped"));
    }
  }
}

BlobReceiver::~BlobReceiver() noexcept(false) {
  stop();
  // What still holds a transfer (a record on its way out, a sink) lets go of it later.
  tasks = nullptr;
  for (auto& [id, transfer] : byId) transfer->orphan();
}

void BlobReceiver::taskFailed(kj::Exception&& e) {
  log->warn("{}: {}", who().cStr(), e.getDescription().cStr());
}

kj::Maybe<kj::Array<capnp::word>> BlobReceiver::place(
    kj::ArrayPtr<const kj::ArrayPtr<const capnp::word>> head, size_t lastWords) {
  if (byId.empty()) return nullptr;
  kj::Maybe<kj::Array<capnp::word>> placed;
  // The message is the peer's: anything in it may be wrong, and then it is read as usual.
  kj::runCatchingExceptions([&]() {
    capnp::ReaderOptions options;
    options.traversalLimitInWords = 4096;
    capnp::SegmentArrayMessageReader reader(head, options);
    auto message = reader.getRoot<capnp::rpc::Message>();
    if (!message.isCall()) return;
    auto call = message.getCall();
    if (call.getInterfaceId() != capnp::typeId<schema::BlobSink>() || call.getMethodId() != 0) {
      return;
    }
    auto params = call.getParams().getContent().getAs<schema::BlobSink::WriteParams>();
    auto at = byId.find(params.getTransfer());
    if (at == byId.end()) return;
    placed = at->second->placeChunk(params.getOffset(), lastWords);
  });
  return placed;
}

void BlobReceiver::accept(kj::StringPtr name, BlobAllocator allocate, BlobHandler handle,
                          BlobAcceptOptions options) {
  validateActorName(name);
  if (acceptors.count(name.cStr()) != 0) {
    throwError(ErrorCode::INVALID_ARGUMENT,
               kj::str("blobs named '", name, "' are accepted already on this server"));
  }
  if (options.idleTimeout <= 0 * kj::SECONDS) {
    throwError(ErrorCode::INVALID_ARGUMENT, "BlobAcceptOptions::idleTimeout must be positive");
  }
  auto acceptor = kj::heap<Acceptor>();
  acceptor->name = name;
  acceptor->allocate = kj::mv(allocate);
  acceptor->handle = kj::mv(handle);
  acceptor->options = kj::mv(options);
  acceptors.emplace(name.cStr(), kj::mv(acceptor));
}

size_t BlobReceiver::transferCount() const {
  size_t n = 0;
  for (auto& [name, acceptor] : acceptors) n += acceptor->transfers.size();
  return n;
}

kj::Promise<void> BlobReceiver::receive(ReceiveContext context,
                                        std::shared_ptr<const LocalPeer> peer) {
  auto params = context.getParams();
  auto h = params.getHeader();
  BlobHeader header{h.getName(), h.getVersion(), h.getSize()};
  auto& acceptor = acceptorFor(header);

  // The same transfer again: its sender died and another resumes it from where it got to (or
  // asks how it went, once it is whole).
  uint64_t id = h.getTransfer();
  auto existing = acceptor.transfers.find(id);
  if (existing != acceptor.transfers.end() &&
      (existing->second->failed() == nullptr || existing->second->handedOver())) {
    auto& transfer = *existing->second;
    if (!transfer.sameBlob(header, h.getChunkBytes())) {
      refuse(kj::str(describe(header), " names transfer ", id, ", which is another blob here"));
    }
    auto t = kj::addRef(transfer);
    return transfer.resume().then([this, context, t = kj::mv(t), header = kj::mv(header),
                                   peer](capnp::Capability::Client sink) mutable {
      auto results = context.getResults();
      results.setSink(sink.castAs<schema::BlobSink>());
      results.setResumeAt(t->received());
      results.setPulls(t->pullFrom(context.getParams().getHeader(), peer));
      log->debug("{}: {} resumed at byte {}", who().cStr(), describe(header).cStr(), t->received());
    });
  }

  auto older = checkNewTransfer(acceptor, header, h);
  auto hops = parseHops(params.getHops());
  kj::Array<kj::byte> memory;
  KJ_IF_MAYBE(e, kj::runCatchingExceptions([&]() { memory = acceptor.allocate(header); })) {
    refuse(kj::str("the receiver refused ", describe(header), ": ", e->getDescription()));
  }
  if (memory.size() < header.size) {
    refuse(
        kj::str("the receiver's allocator gave ", memory.size(), " bytes for ", describe(header)));
  }
  KJ_IF_MAYBE(o, older) {
    o->abort(makeError(ErrorCode::BLOB_ABORTED, kj::str("superseded by version ", header.version)));
  }
  acceptor.transfers.erase(id);  // a failed transfer of the same id: start afresh

  BlobParams forward;
  forward.name = header.name;
  forward.version = header.version;
  forward.transfer = id;
  forward.chunkBytes = h.getChunkBytes();
  forward.windowBytes = h.getWindowBytes();
  forward.stallTimeout = h.getStallMillis() * kj::MILLISECONDS;
  forward.channel = forwarding;
  forward.sameHostReads = h.getSameHostReads();
  auto source = kj::refcounted<BlobSource>(kj::mv(memory), header.size, forward.chunkBytes, 0,
                                           acceptor.options.device, forward.windowBytes);
  auto transfer = kj::refcounted<Transfer>(*this, acceptor, header, kj::mv(forward), kj::mv(source),
                                           kj::mv(hops));
  auto results = context.getResults();
  results.setSink(Transfer::newSink(kj::addRef(*transfer)).castAs<schema::BlobSink>());
  results.setResumeAt(0);
  results.setPulls(transfer->pullFrom(h, peer));
  acceptor.transfers.emplace(id, kj::mv(transfer));
  return kj::READY_NOW;
}

BlobReceiver::Acceptor& BlobReceiver::acceptorFor(const BlobHeader& header) {
  auto found = acceptors.find(header.name);
  if (found == acceptors.end()) {
    kj::Vector<kj::StringPtr> names;
    for (auto& [name, a] : acceptors) names.add(name);
    refuse(kj::str("no receiver of blobs named '", printable(header.name), "' at ", who(),
                   " (accepting: ", names.empty() ? kj::str("none") : kj::strArray(names, ", "),
                   ")"));
  }
  return *found->second;
}

kj::Maybe<BlobReceiver::Transfer&> BlobReceiver::checkNewTransfer(Acceptor& acceptor,
                                                                  const BlobHeader& header,
                                                                  schema::BlobHeader::Reader h) {
  uint32_t chunk = h.getChunkBytes();
  if (chunk < MIN_CHUNK_BYTES || chunk > MAX_CHUNK_BYTES || chunk % 8 != 0 ||
      h.getWindowBytes() == 0 || h.getStallMillis() == 0) {
    throwError(ErrorCode::INVALID_ARGUMENT,
               kj::str(describe(header), ": chunks of ", chunk, " bytes, a window of ",
                       h.getWindowBytes(), " bytes and a stall timeout of ", h.getStallMillis(),
                       " ms are not taken (chunks: a multiple of 8 from ", MIN_CHUNK_BYTES, " to ",
                       MAX_CHUNK_BYTES, "; the others above 0)"));
  }
  if (header.size > acceptor.options.maxBytes) {
    refuse(kj::str(describe(header), " is larger than this receiver's limit of ",
                   acceptor.options.maxBytes, " bytes"));
  }
  KJ_IF_MAYBE(v, acceptor.delivered) {
    if (!acceptor.options.acceptStaleVersions && header.version <= *v) {
      refuse(kj::str(describe(header), " is stale: this receiver has version ", *v));
    }
  }
  kj::Maybe<Transfer&> older;
  for (auto& [otherId, other] : acceptor.transfers) {
    if (!other->inProgress()) continue;
    if (other->version() >= header.version) {
      refuse(kj::str(describe(header), " is stale: this receiver is receiving version ",
                     other->version()));
    }
    older = *other;
  }
  return older;
}

}  // namespace troupe::actor_detail
