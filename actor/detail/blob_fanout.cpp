#include "troupe/actor/detail/blob_fanout.h"

#include <string.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>

#include <kj/debug.h>

#include "troupe/actor/detail/sender_memory.h"
#include "troupe/actor/endpoint.h"
#include "troupe/base/errors.h"
#include "troupe/net/bytes.h"
#include "troupe/net/same_host.h"

#define XXH_INLINE_ALL
#include <xxhash.h>

namespace troupe::actor_detail {

BlobResult copyOf(const BlobResult& r) {
  BlobResult c;
  c.endpoint = r.endpoint;
  c.address = r.address;
  c.error = r.error.map([](const kj::Exception& e) { return kj::cp(e); });
  c.bytes = r.bytes;
  c.pulledBytes = r.pulledBytes;
  c.latency = r.latency;
  return c;
}

#if defined(__x86_64__)
// blob_checksum_avx2.cpp
uint64_t blobChecksumAvx2(const void* bytes, size_t size);
uint64_t copyWithChecksumAvx2(void* to, const void* from, size_t size, size_t step);
#endif

namespace {

// copyWithChecksum() hashes and copies this many bytes at a time: a step the copy reads back from
// the core's own cache (measured: bench/README.md, "Same host").
constexpr size_t COPY_STEP_BYTES = 256 * 1024;

#if defined(__x86_64__)
// Asked on first use, not while libraries are still being initialized.
bool hasAvx2() {
  static const bool avx2 = []() {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") != 0;
  }();
  return avx2;
}
#endif

}  // namespace

uint64_t blobChecksum(kj::ArrayPtr<const kj::byte> bytes) {
#if defined(__x86_64__)
  // Both sides of every chunk hash it: the AVX2 build is about 1.6x the SSE2 one here.
  if (hasAvx2()) return blobChecksumAvx2(bytes.begin(), bytes.size());
#endif
  return XXH3_64bits(bytes.begin(), bytes.size());
}

uint64_t copyWithChecksum(kj::byte* to, kj::ArrayPtr<const kj::byte> from) {
#if defined(__x86_64__)
  if (hasAvx2()) return copyWithChecksumAvx2(to, from.begin(), from.size(), COPY_STEP_BYTES);
#endif
  return copyWithChecksumPortable(to, from);
}

uint64_t copyWithChecksumPortable(kj::byte* to, kj::ArrayPtr<const kj::byte> from) {
  XXH3_state_t state;
  XXH3_64bits_reset(&state);
  for (size_t at = 0; at < from.size(); at += COPY_STEP_BYTES) {
    size_t n = std::min(from.size() - at, COPY_STEP_BYTES);
    XXH3_64bits_update(&state, from.begin() + at, n);
    memcpy(to + at, from.begin() + at, n);
  }
  return XXH3_64bits_digest(&state);
}

// ---------------------------------------------------------------------------------------------
// BlobSource

// A device source's chunk in a staging buffer: what hostChunk() hands out while anyone holds it.
struct BlobSource::Staged final : public kj::Refcounted {
  Staged(kj::Own<BlobSource> source, uint64_t index, kj::Array<const kj::byte> bytes)
      : source(kj::mv(source)), index(index), bytes(kj::mv(bytes)) {}
  ~Staged() noexcept(false) {
    auto at = source->staged.find(index);
    if (at != source->staged.end() && at->second == this) source->staged.erase(at);
  }

  // The bytes, holding this.
  kj::Array<const kj::byte> handOut() {
    return kj::ArrayPtr<const kj::byte>(bytes.begin(), bytes.size()).attach(kj::addRef(*this));
  }

  kj::Own<BlobSource> source;
  const uint64_t index;
  kj::Array<const kj::byte> bytes;
};

BlobSource::BlobSource(kj::Array<const kj::byte> memory, uint64_t size, uint32_t chunkBytes,
                       uint64_t available, std::shared_ptr<BlobDevice> device, uint64_t windowBytes)
    : memory(kj::mv(memory)),
      size_(size),
      chunkBytes_(chunkBytes),
      available_(available),
      device_(kj::mv(device)),
      resident_(available) {
  KJ_REQUIRE(this->memory.size() >= size, "a blob's memory is smaller than the blob");
  KJ_REQUIRE(chunkBytes > 0 && available <= size);
  checksums.resize(chunkCount());
  known.resize(chunkCount());
  if (device_ != nullptr) {
    ring = kj::refcounted<StagingRing>(device_, chunkBytes,
                                       StagingRing::buffersFor(chunkBytes, windowBytes));
  }
}

BlobSource::~BlobSource() noexcept(false) = default;

uint64_t BlobSource::chunkSize(uint64_t index) const {
  return std::min<uint64_t>(chunkBytes_, size_ - index * chunkBytes_);
}

void BlobSource::append(uint64_t checksum) {
  uint64_t index = available_ / chunkBytes_;
  KJ_REQUIRE(index < chunkCount(), "a chunk past the blob's end");
  checksums[index] = checksum;
  known[index] = true;
  available_ += chunkSize(index);
  grew.notify();
}

void BlobSource::appendUnchecked() {
  uint64_t index = available_ / chunkBytes_;
  KJ_REQUIRE(index < chunkCount(), "a chunk past the blob's end");
  available_ += chunkSize(index);
  grew.notify();
}

void BlobSource::settle(uint64_t bytes) {
  resident_ += bytes;
  KJ_REQUIRE(resident_ <= available_, "bytes in the device that never arrived");
  grew.notify();
}

kj::Promise<void> BlobSource::whenResident(uint64_t bytes) {
  return whenReached(&BlobSource::resident, bytes);
}

kj::Promise<void> BlobSource::whenReached(uint64_t (BlobSource::*mark)() const, uint64_t bytes) {
  KJ_IF_MAYBE(e, failure_) {
    return kj::cp(*e);
  }
  if ((this->*mark)() >= bytes) return kj::READY_NOW;
  return grew.next().then([this, mark, bytes]() { return whenReached(mark, bytes); });
}

kj::Maybe<kj::ArrayPtr<const kj::byte>> BlobSource::exported() {
  if (device_ == nullptr) return nullptr;
  if (!exportTried) {
    exportTried = true;
    exportFailure_ = kj::runCatchingExceptions(
        [&]() { exported_ = device_->exportMemory(memory.begin(), size_); });
  }
  KJ_IF_MAYBE(handle, exported_) {
    return kj::ArrayPtr<const kj::byte>(handle->begin(), handle->size());
  }
  return nullptr;
}

uint64_t BlobSource::checksum(uint64_t index) {
  KJ_REQUIRE(index * chunkBytes_ + chunkSize(index) <= available_, "the chunk is not in place");
  if (!known[index]) {
    KJ_REQUIRE(device_ == nullptr, "a device chunk's checksum is known once it is staged");
    checksums[index] = blobChecksum(
        memory.slice(index * chunkBytes_, index * chunkBytes_ + chunkSize(index)));
    known[index] = true;
  }
  return checksums[index];
}

void BlobSource::fail(kj::Exception reason) {
  if (failure_ != nullptr) return;
  failure_ = kj::mv(reason);
  grew.notify();
}

kj::Promise<void> BlobSource::whenAvailable(uint64_t bytes) {
  return whenReached(&BlobSource::available, bytes);
}

kj::Array<const kj::byte> BlobSource::slice(uint64_t offset, uint64_t length) {
  KJ_REQUIRE(offset + length <= available_);
  return kj::ArrayPtr<const kj::byte>(memory.begin() + offset, length).attach(kj::addRef(*this));
}

kj::Promise<kj::Array<const kj::byte>> BlobSource::hostChunk(uint64_t index) {
  uint64_t offset = index * chunkBytes_;
  uint64_t length = chunkSize(index);
  if (device_ == nullptr) return slice(offset, length);
  KJ_REQUIRE(offset + length <= available_, "the chunk is not in place");
  auto at = staged.find(index);
  if (at != staged.end()) return at->second->handOut();
  auto self = kj::addRef(*this);
  return staging().take().then(
      [this, self = kj::mv(self), index, offset, length](kj::Array<kj::byte> buffer) mutable {
        // The copy holds the buffer and the source to its end, even if whoever asked lets go: the
        // device writes the one and reads the other until then.
        auto shared = kj::refcounted<StagingBuffer>(kj::mv(buffer));
        auto* to = shared->bytes.begin();
        auto copied = device_->copyOut(to, memory.begin() + offset, length)
                          .attach(kj::addRef(*shared), kj::addRef(*this))
                          .fork();
        copied.addBranch().detach([](kj::Exception&&) {});
        return copied.addBranch().then([this, self = kj::mv(self), index, length,
                                        shared = kj::mv(shared)]() mutable {
          auto at = staged.find(index);
          if (at != staged.end()) return at->second->handOut();  // staged meanwhile by another
          kj::Array<const kj::byte> bytes =
              kj::ArrayPtr<const kj::byte>(shared->bytes.begin(), length).attach(kj::mv(shared));
          if (!known[index]) {
            checksums[index] = blobChecksum(bytes);
            known[index] = true;
          }
          return offerStaged(index, kj::mv(bytes));
        });
      });
}

kj::Array<const kj::byte> BlobSource::offerStaged(uint64_t index, kj::Array<const kj::byte> bytes) {
  auto chunk = kj::refcounted<Staged>(kj::addRef(*this), index, kj::mv(bytes));
  staged[index] = chunk.get();
  return chunk->handOut();
}

// ---------------------------------------------------------------------------------------------
// Layout

std::vector<BlobHop> layOut(kj::ArrayPtr<const BlobTarget> targets, Fanout fanout,
                            uint32_t treeFanout) {
  auto hop = [&](size_t i) {
    auto& t = targets[i];
    return BlobHop{t.endpoint, t.address, t.sameHostSocket, t.sameHostId, {}};
  };
  size_t n = targets.size();
  std::vector<BlobHop> roots;
  switch (fanout) {
    case Fanout::STAR:
      for (size_t i = 0; i < n; ++i) roots.push_back(hop(i));
      break;
    case Fanout::CHAIN: {
      if (n == 0) break;
      BlobHop next = hop(n - 1);
      for (size_t i = n - 1; i-- > 0;) {
        BlobHop h = hop(i);
        h.children.push_back(kj::mv(next));
        next = kj::mv(h);
      }
      roots.push_back(kj::mv(next));
      break;
    }
    case Fanout::TREE: {
      // Node i's children are k(i+1) .. k(i+1)+k-1: a k-ary heap under the sender.
      size_t k = std::max<uint32_t>(treeFanout, 1);
      std::vector<BlobHop> nodes;
      for (size_t i = 0; i < n; ++i) nodes.push_back(hop(i));
      for (size_t i = n; i-- > 0;) {
        for (size_t j = 0; j < k; ++j) {
          size_t child = k * (i + 1) + j;
          if (child < n) nodes[i].children.push_back(kj::mv(nodes[child]));
        }
      }
      for (size_t i = 0; i < std::min(k, n); ++i) roots.push_back(kj::mv(nodes[i]));
      break;
    }
  }
  return roots;
}

namespace {

void flatten(const std::vector<BlobHop>& hops, int32_t parent,
             std::vector<std::pair<const BlobHop*, int32_t>>& out) {
  for (auto& h : hops) {
    auto index = static_cast<int32_t>(out.size());
    out.emplace_back(&h, parent);
    flatten(h.children, index, out);
  }
}

void writeHops(capnp::List<schema::BlobHop>::Builder out,
               const std::vector<std::pair<const BlobHop*, int32_t>>& flat) {
  for (uint i = 0; i < flat.size(); ++i) {
    out[i].setEndpoint(flat[i].first->endpoint);
    out[i].setAddress(flat[i].first->address);
    out[i].setSameHostSocket(flat[i].first->sameHostSocket);
    out[i].setSameHostId(flat[i].first->sameHostId);
    out[i].setParent(flat[i].second);
  }
}

}  // namespace

std::vector<BlobHop> parseHops(capnp::List<schema::BlobHop>::Reader hops) {
  if (hops.size() > MAX_BLOB_HOPS) {
    throwError(ErrorCode::INVALID_ARGUMENT,
               kj::str("a blob is to be forwarded to ", hops.size(), " members; at most ",
                       MAX_BLOB_HOPS, " are taken"));
  }
  // Built bottom-up: each hop's children are complete before it moves into its parent.
  std::vector<BlobHop> all(hops.size());
  std::vector<int32_t> parents(hops.size());
  for (uint i = 0; i < hops.size(); ++i) {
    auto h = hops[i];
    auto parent = h.getParent();
    if (parent < -1 || parent >= static_cast<int32_t>(i)) {
      throwError(ErrorCode::INVALID_ARGUMENT, kj::str("blob hop ", i, " names hop ", parent,
                                                      " as its parent, which does not "
                                                      "come before it"));
    }
    all[i].endpoint = h.getEndpoint();
    all[i].address = h.getAddress();
    all[i].sameHostSocket = h.getSameHostSocket();
    all[i].sameHostId = h.getSameHostId();
    parents[i] = parent;
  }
  std::vector<BlobHop> roots;
  for (size_t i = hops.size(); i-- > 0;) {
    auto& target = parents[i] < 0 ? roots : all[parents[i]].children;
    target.push_back(kj::mv(all[i]));
  }
  // Taken last to first: put each list back in the order given.
  std::vector<std::vector<BlobHop>*> lists{&roots};
  while (!lists.empty()) {
    auto* list = lists.back();
    lists.pop_back();
    std::reverse(list->begin(), list->end());
    for (auto& h : *list) lists.push_back(&h.children);
  }
  return roots;
}

namespace {

void collectEndpoints(const std::vector<BlobHop>& hops, std::vector<std::string>& names,
                      std::map<std::string, std::string>& addresses) {
  for (auto& h : hops) {
    names.push_back(h.endpoint);
    addresses[h.endpoint] = h.address;
    collectEndpoints(h.children, names, addresses);
  }
}

// Every endpoint under `hop`, itself included.
void subtree(const BlobHop& hop, std::vector<std::string>& out) {
  out.push_back(hop.endpoint);
  for (auto& c : hop.children) subtree(c, out);
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// One member being sent to

class BlobFanout::Hop final : private kj::TaskSet::ErrorHandler {
public:
  Hop(BlobFanout& fanout, BlobHop hop)
      : fanout(fanout),
        hop(kj::mv(hop)),
        startedAt(fanout.loop_.timer().now()),
        writes(kj::heap<kj::TaskSet>(static_cast<kj::TaskSet::ErrorHandler&>(*this))),
        failed(nullptr),
        task(nullptr) {
    auto paf = kj::newPromiseAndFulfiller<void>();
    failed = kj::mv(paf.promise);
    failer = kj::mv(paf.fulfiller);
  }

  void start() {
    task = kj::evalNow([this]() { return open(); })
               .then([this]() { return pump(); })
               .then([this]() { return finish(); })
               .exclusiveJoin(kj::mv(failed))
               .exclusiveJoin(watchdog())
               .then([this]() { fanout.ended(*this, nullptr, kj::mv(reported)); },
                     [this](kj::Exception&& e) { fanout.ended(*this, kj::mv(e), {}); })
               .eagerlyEvaluate(nullptr);
  }

  // Tells the member to give up, if it was reached (best effort, bounded by the stall timeout):
  // the returned promise holds the connection until the request is answered.
  kj::Maybe<kj::Promise<void>> sendAbort(kj::StringPtr reason) {
    KJ_IF_MAYBE(s, sink) {
      auto request = s->abortRequest();
      request.setReason(reason);
      auto& timer = fanout.loop_.timer();
      auto answered = request.send()
                          .ignoreResult()
                          .exclusiveJoin(timer.afterDelay(fanout.params.stallTimeout))
                          .attach(channel->addRef());
      // A member copying from our memory answers once its copies are done: the memory stays
      // until then (freeing memory another process has open, or reads, is not allowed).
      if (pulls && fanout.source.get() != nullptr) {
        return answered.attach(kj::addRef(*fanout.source));
      }
      return kj::mv(answered);
    }
    return nullptr;
  }

  BlobFanout& fanout;
  const BlobHop hop;
  const kj::TimePoint startedAt;
  uint64_t acked = 0;       // bytes the member acknowledged (from where it resumed)
  bool superseded = false;  // another sender took the member over: it reports the outcome
  bool pulls = false;       // the member copies chunks from our memory itself
  std::vector<BlobResult> reported;

private:
  kj::Promise<void> open() {
    auto& p = fanout.params;
    auto address = connectAddress(hop.address, hop.sameHostSocket, hop.sameHostId);
    channel = Channel::open(fanout.loop_, address, p.channel);
    auto request = channel->host().receiveBlobRequest();
    auto header = request.initHeader();
    header.setName(p.name);
    header.setVersion(p.version);
    header.setSize(fanout.source->size());
    header.setTransfer(p.transfer);
    header.setChunkBytes(p.chunkBytes);
    header.setWindowBytes(p.windowBytes);
    header.setSameHostReads(p.sameHostReads);
    header.setStallMillis(
        static_cast<uint32_t>(std::min<int64_t>(p.stallTimeout / kj::MILLISECONDS, UINT32_MAX)));
    std::vector<std::pair<const BlobHop*, int32_t>> flat;
    flatten(hop.children, -1, flat);
    writeHops(request.initHops(flat.size()), flat);
    bool offered = false;  // the member may copy the chunks out of our memory itself
    if (kj::StringPtr(address).startsWith("unix:")) {
      // On this host: a member whose memory is on a device that can open ours copies from it;
      // one whose memory is host memory may read ours, where it is host memory too.
      auto& source = *fanout.source;
      KJ_IF_MAYBE(exported, source.exported()) {
        header.setDeviceMemory(*exported);
        header.setDeviceHost(sameHostId());
        offered = true;
      } else if (source.device() != nullptr) {
        // Said once a process at info (it is how the device and its driver are set up), as the
        // member says why it cannot open memory that was offered.
        static std::atomic<bool> said{false};
        kj::String why = kj::str(source.device()->name(), " exports no memory");
        KJ_IF_MAYBE(e, source.exportFailure()) {
          why = kj::str(source.device()->name(), " cannot export it: ", e->getDescription());
        }
        fanout.log->log(said.exchange(true) ? spdlog::level::debug : spdlog::level::info,
                        "blob '{}' v{}: {} gets its chunks through host memory, not from this "
                        "process's device memory: {}",
                        p.name, p.version, hop.endpoint, why.cStr());
      } else if (p.sameHostReads && source.size() > 0) {
        header.setSenderPid(static_cast<uint32_t>(getpid()));
        header.setSenderMemory(reinterpret_cast<uintptr_t>(source.begin()));
        offered = true;
      }
    }
    return request.send().then(
        [this, offered](capnp::Response<schema::ActorHost::ReceiveBlobResults> r) {
          sink = r.getSink();
          pulls = r.getPulls() && offered;
          uint64_t at = r.getResumeAt();
          auto size = fanout.source->size();
          if (at > size || (at < size && at % fanout.source->chunkBytes() != 0)) {
            throwError(ErrorCode::FAILED, kj::str("the member resumes at byte ", at,
                                                  ", not at a chunk of the ", size, "-byte blob"));
          }
          next = acked = at;
          progressed = true;
        });
  }

  // Sends every chunk from `next` on as it becomes available, keeping at most the window in
  // flight; resolves once the member acknowledged the last.
  kj::Promise<void> pump() {
    auto& source = *fanout.source;
    while (next < source.size() && !superseded) {
      uint64_t index = next / source.chunkBytes();
      uint64_t length = source.chunkSize(index);
      if (pulls && source.resident() < next + length) {
        // The member copies from our device memory: the chunk must be there, not only staged.
        return source.whenResident(next + length).then([this]() { return pump(); });
      }
      if (source.available() < next + length) {
        return source.whenAvailable(next + length).then([this]() { return pump(); });
      }
      if (inFlight > 0 && inFlight + length > fanout.params.windowBytes) {
        return acks.next().then([this]() { return pump(); });
      }
      if (pulls) {
        send(index, length, nullptr);
        continue;
      }
      if (source.device() != nullptr) {
        // Staged out of the device first; the copy of the next overlaps this one's sending.
        return source.hostChunk(index).then([this, index, length](kj::Array<const kj::byte> bytes) {
          if (!superseded) send(index, length, kj::mv(bytes));
          return pump();
        });
      }
      send(index, length, source.slice(next, length));
    }
    if (inFlight > 0 && !superseded) return acks.next().then([this]() { return pump(); });
    return kj::READY_NOW;
  }

  void send(uint64_t index, uint64_t length, kj::Array<const kj::byte> bytes) {
    auto& source = *fanout.source;
    auto request = KJ_ASSERT_NONNULL(sink).writeRequest(capnp::MessageSize{16, 0});
    request.setOffset(next);
    request.setTransfer(fanout.params.transfer);
    if (pulls) {
      request.setPulled(true);  // in our memory, which the member copies from
      // Held at least the stall timeout from now, whatever becomes of the transfer (ended()).
      request.setHeldUntil(SenderMemory::now() + fanout.params.stallTimeout / kj::NANOSECONDS);
    } else {
      request.setChecksum(source.checksum(index));
      adoptBytes(request, &schema::BlobSink::WriteParams::Builder::adoptData, kj::mv(bytes));
    }
    inFlight += length;
    next += length;
    writes->add(
        request.send().then([this, length](capnp::Response<schema::BlobSink::WriteResults> r) {
          inFlight -= length;
          acked += length;
          progressed = true;
          if (r.getSuperseded()) superseded = true;
          acks.notify();
        }));
  }

  kj::Promise<void> finish() {
    if (superseded) return kj::READY_NOW;
    return KJ_ASSERT_NONNULL(sink).finishRequest().send().then(
        [this](capnp::Response<schema::BlobSink::FinishResults> r) {
          if (r.getSuperseded()) {
            superseded = true;
            return;
          }
          bool first = true;
          for (auto o : r.getOutcomes()) {
            BlobResult result;
            // The member's own outcome comes first, unnamed: it may be known by several names.
            result.endpoint = first ? hop.endpoint : std::string(o.getEndpoint());
            first = false;
            auto at = fanout.addresses.find(result.endpoint);
            if (at != fanout.addresses.end()) result.address = at->second;
            result.bytes = o.getBytes();
            result.pulledBytes = o.getPulled();
            result.latency = o.getMicros() * kj::MICROSECONDS;
            if (!o.getOk()) {
              // The peer's word: a type out of range is taken as FAILED.
              auto type = o.getErrorType() <= uint8_t(kj::Exception::Type::UNIMPLEMENTED)
                              ? static_cast<kj::Exception::Type>(o.getErrorType())
                              : kj::Exception::Type::FAILED;
              result.error = kj::Exception(type, __FILE__, __LINE__, kj::str(o.getError()));
            }
            reported.push_back(kj::mv(result));
          }
        });
  }

  // Rejects once the member makes no progress for a stall timeout and then does not answer a
  // ping within another.
  kj::Promise<void> watchdog() {
    auto stall = fanout.params.stallTimeout;
    auto& timer = fanout.loop_.timer();
    return timer.afterDelay(stall).then([this, stall, &timer]() -> kj::Promise<void> {
      if (progressed || channel.get() == nullptr) {
        progressed = false;
        return watchdog();
      }
      auto expired = timer.afterDelay(stall).then([stall]() -> kj::Promise<void> {
        return makeError(ErrorCode::DEADLINE_EXCEEDED,
                         kj::str("no progress in ", stall / kj::MILLISECONDS,
                                 " ms, and no answer to a ping within as long"));
      });
      return channel->host()
          .pingRequest()
          .send()
          .ignoreResult()
          .exclusiveJoin(kj::mv(expired))
          .then([this]() { return watchdog(); });
    });
  }

  void taskFailed(kj::Exception&& exception) override { failer->reject(kj::mv(exception)); }

  kj::Own<Channel> channel;
  kj::Maybe<schema::BlobSink::Client> sink;
  uint64_t next = 0;      // the next byte to send
  uint64_t inFlight = 0;  // bytes sent and not acknowledged
  bool progressed = false;
  ChangeSignal acks;
  kj::Own<kj::TaskSet> writes;
  kj::Own<kj::PromiseFulfiller<void>> failer;
  kj::Promise<void> failed;  // rejects when a write fails
  kj::Promise<void> task;    // last: cancelled first
};

// ---------------------------------------------------------------------------------------------
// BlobFanout

BlobFanout::BlobFanout(EventLoop& loop, kj::Own<BlobSource> source, BlobParams params,
                       std::vector<BlobHop> roots, std::shared_ptr<spdlog::logger> log)
    : loop_(loop),
      source(kj::mv(source)),
      params(kj::mv(params)),
      log(kj::mv(log)),
      tasks(kj::heap<kj::TaskSet>(static_cast<kj::TaskSet::ErrorHandler&>(*this))) {
  collectEndpoints(roots, endpoints_, addresses);
  for (auto& root : roots) start(kj::mv(root));
  started = true;
}

BlobFanout::~BlobFanout() noexcept(false) {
  // Members still receiving are told to give up, on the loop's own time: the requests hold
  // their connections and end within the stall timeout.
  for (auto& hop : running) {
    KJ_IF_MAYBE(goodbye, hop->sendAbort("the sender gave the transfer up")) {
      goodbye->detach([](kj::Exception&&) {});
    }
  }
  running.clear();
}

void BlobFanout::start(BlobHop hop) {
  running.push_back(kj::heap<Hop>(*this, kj::mv(hop)));
  running.back()->start();
}

kj::Promise<void> BlobFanout::whenDone() {
  if (done()) return kj::READY_NOW;
  return changed.next().then([this]() { return whenDone(); });
}

void BlobFanout::record(BlobResult outcome) {
  auto at = outcomes_.find(outcome.endpoint);
  // A member reported twice (resumed by another sender) counts as having the blob if any report
  // says so.
  if (at != outcomes_.end() && (at->second.ok() || !outcome.ok())) return;
  outcomes_[outcome.endpoint] = kj::mv(outcome);
}

void BlobFanout::ended(Hop& hop, kj::Maybe<kj::Exception> error, std::vector<BlobResult> reported) {
  auto& member = hop.hop;
  if (hop.superseded) {
    // Another sender resumed the member: that sender reports it and those it forwards to.
  } else KJ_IF_MAYBE(e, error) {
    BlobResult failed;
    failed.endpoint = member.endpoint;
    failed.address = member.address;
    failed.error = withContext(*e, kj::str(member.endpoint, " (", member.address, ")"));
    failed.bytes = hop.acked;
    failed.latency = loop_.timer().now() - hop.startedAt;
    log->warn("blob '{}' v{}: {} failed ({}); sending to the {} member(s) it forwards to directly",
              params.name, params.version, member.endpoint, e->getDescription().cStr(),
              member.children.size());
    record(kj::mv(failed));
    if (hop.pulls && source.get() != nullptr) {
      // It may still be copying from our memory (its copies in flight, a window's worth): the
      // memory stays that long at most, as freeing memory another process has open (or reads,
      // and would take whatever came to be there for the blob) is not allowed.
      loop_.timer()
          .afterDelay(params.stallTimeout)
          .attach(kj::addRef(*source))
          .detach([](kj::Exception&&) {});
    }
    // Its children are resumed from here, which supersedes it where it still forwards; it is
    // not told to give up (that would give up its children's parts too), and frees its own
    // part by its idle timeout.
    for (auto& child : member.children) start(child);
  } else {
    for (auto& o : reported) record(kj::mv(o));
  }
  // Destroyed on a later turn: this runs inside the hop's own promise.
  for (auto it = running.begin(); it != running.end(); ++it) {
    if (it->get() == &hop) {
      tasks->add(kj::evalLater([gone = kj::mv(*it)]() {}));
      running.erase(it);
      break;
    }
  }
  if (running.empty()) source = nullptr;  // done: the blob's memory goes once chunks let go
  changed.notify();
}

void BlobFanout::abort(const kj::Exception& reason) {
  for (auto& hop : running) {
    // Left to the loop, not to this fanout's tasks: the fanout may go before the member reads
    // the request (a member whose loop stalls reads it only once the chunks before it are
    // read), and the connection must stay open until then for the request to reach it.
    KJ_IF_MAYBE(goodbye, hop->sendAbort(reason.getDescription())) {
      goodbye->detach([](kj::Exception&&) {});
    }
    std::vector<std::string> members;
    subtree(hop->hop, members);
    for (auto& name : members) {
      if (outcomes_.count(name) != 0) continue;
      BlobResult r;
      r.endpoint = name;
      r.address = addresses[name];
      r.error = kj::cp(reason);
      if (name == hop->hop.endpoint) r.bytes = hop->acked;
      r.latency = loop_.timer().now() - hop->startedAt;
      outcomes_[name] = kj::mv(r);
    }
  }
  running.clear();
  source = nullptr;
  changed.notify();
}

void BlobFanout::taskFailed(kj::Exception&&) {
  // Only hops being let go of run here, and letting go does not fail.
}

}  // namespace troupe::actor_detail
