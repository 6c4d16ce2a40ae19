#include "troupe/actor/blob.h"

#include <errno.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>

#include <map>
#include <set>

#include <kj/debug.h>

#include "troupe/actor/detail/blob_fanout.h"
#include "troupe/actor/endpoint.h"
#include "troupe/base/errors.h"

namespace troupe {

namespace {

// Unique among every sender's transfers (it names one to the receivers, which resume a transfer
// by it): from the kernel, not from the loop's seeded generator.
uint64_t newTransferId() {
  uint64_t id = 0;
  while (id == 0) {
    KJ_SYSCALL(getrandom(&id, sizeof(id), 0));
  }
  return id;
}

void checkOptions(const BlobSendOptions& o) {
  auto invalid = [](kj::StringPtr why) { throwError(ErrorCode::INVALID_ARGUMENT, why); };
  if (o.chunkBytes < 4096 || o.chunkBytes > (64u << 20) || o.chunkBytes % 8 != 0) {
    invalid(kj::str("BlobSendOptions::chunkBytes must be a multiple of 8 from 4096 to 64 MiB, not ",
                    o.chunkBytes));
  }
  if (o.windowBytes == 0) invalid("BlobSendOptions::windowBytes must be above 0");
  if (o.stallTimeout < 1 * kj::MILLISECONDS) {
    invalid("BlobSendOptions::stallTimeout must be at least 1 ms");
  }
  if (o.fanout == Fanout::TREE && o.treeFanout == 0) {
    invalid("BlobSendOptions::treeFanout must be at least 1");
  }
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// allocateBlobMemory

namespace {

constexpr uint64_t HUGE_PAGE_BYTES = uint64_t{2} << 20;
constexpr uint64_t MAPPED_BLOB_MIN_BYTES = uint64_t{8} << 20;

// Unmaps what allocateBlobMemory() mapped: `capacity` bytes from the first, rounded up to whole
// huge pages as it was mapped.
class UnmapDisposer final : public kj::ArrayDisposer {
public:
  static const UnmapDisposer instance;

protected:
  void disposeImpl(void* first, size_t, size_t, size_t capacity, void (*)(void*)) const override {
    munmap(first, (capacity + HUGE_PAGE_BYTES - 1) & ~(HUGE_PAGE_BYTES - 1));
  }
};
const UnmapDisposer UnmapDisposer::instance;

}  // namespace

kj::Array<kj::byte> allocateBlobMemory(uint64_t size) {
  if (size < MAPPED_BLOB_MIN_BYTES) return kj::heapArray<kj::byte>(size);
  if (size > UINT64_MAX - 2 * HUGE_PAGE_BYTES) {
    throwError(ErrorCode::INVALID_ARGUMENT,
               kj::str("a blob of ", size, " bytes is more than any memory holds"));
  }
  uint64_t rounded = (size + HUGE_PAGE_BYTES - 1) & ~(HUGE_PAGE_BYTES - 1);
  // Mapped with a huge page's room to spare, then trimmed to an aligned start.
  uint64_t mapped = rounded + HUGE_PAGE_BYTES;
  void* map = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (map == MAP_FAILED) {
    int error = errno;
    throwError(error == ENOMEM ? ErrorCode::OVERLOADED : ErrorCode::FAILED,
               kj::str("cannot map ", size, " bytes for a blob: ", strerror(error)));
  }
  auto base = reinterpret_cast<uintptr_t>(map);
  auto start = (base + HUGE_PAGE_BYTES - 1) & ~(HUGE_PAGE_BYTES - 1);
  if (start > base) munmap(map, start - base);
  uint64_t tail = base + mapped - (start + rounded);
  if (tail > 0) munmap(reinterpret_cast<void*>(start + rounded), tail);
  // Advice only: without transparent huge pages the memory is as good, in small pages.
  madvise(reinterpret_cast<void*>(start), rounded, MADV_HUGEPAGE);
  return kj::Array<kj::byte>(reinterpret_cast<kj::byte*>(start), size, UnmapDisposer::instance);
}

BlobTransfer::BlobTransfer(kj::Own<actor_detail::BlobFanout> fanout,
                           std::vector<std::string> members)
    : fanout(kj::mv(fanout)), members(kj::mv(members)) {}
BlobTransfer::BlobTransfer(BlobTransfer&&) = default;
BlobTransfer& BlobTransfer::operator=(BlobTransfer&&) = default;
BlobTransfer::~BlobTransfer() noexcept(false) {}

size_t BlobTransfer::size() const { return members.size(); }

kj::Promise<kj::Array<BlobResult>> BlobTransfer::waitAll(kj::Duration deadline) {
  auto& f = *fanout;
  auto expired = f.loop().timer().afterDelay(deadline).then([&f, deadline]() {
    f.abort(
        makeError(ErrorCode::DEADLINE_EXCEEDED, kj::str("the blob transfer did not finish within ",
                                                        deadline / kj::MILLISECONDS, " ms")));
  });
  return f.whenDone()
      .exclusiveJoin(kj::mv(expired))
      .then([&f, members = members]() mutable {
        auto& outcomes = f.outcomes();
        return KJ_MAP(name, members) {
          auto at = outcomes.find(name);
          if (at != outcomes.end()) return actor_detail::copyOf(at->second);
          // No member reported it (a broken peer's report): it cannot be said to have it.
          BlobResult missing;
          missing.endpoint = name;
          missing.error = makeError(ErrorCode::FAILED,
                                    kj::str(name, ": no member reported what became of the blob"));
          return missing;
        };
      })
      .attach(kj::addRef(f));
}

BlobTransfer sendBlob(EventLoop& loop, kj::ArrayPtr<const BlobTarget> targets, kj::StringPtr name,
                      uint64_t version, kj::Array<const kj::byte> bytes, BlobSendOptions options) {
  validateActorName(name);
  checkOptions(options);
  if (targets.size() == 0) {
    throwError(ErrorCode::INVALID_ARGUMENT, "a blob needs a member to go to");
  }
  if (targets.size() > actor_detail::MAX_BLOB_HOPS) {
    throwError(ErrorCode::INVALID_ARGUMENT,
               kj::str("a blob goes to at most ", actor_detail::MAX_BLOB_HOPS, " members, not ",
                       targets.size()));
  }
  std::set<std::string> names;
  std::map<std::string, std::string> addresses;  // address -> endpoint
  std::vector<std::string> members;
  for (auto& t : targets) {
    members.push_back(t.endpoint);
    if (!names.insert(t.endpoint).second) {
      throwError(ErrorCode::INVALID_ARGUMENT,
                 kj::str("member '", printable(t.endpoint), "' is named twice"));
    }
    // One server receives a blob once: two members there would resume each other's transfer.
    auto [at, fresh] = addresses.emplace(t.address, t.endpoint);
    if (!fresh) {
      throwError(ErrorCode::INVALID_ARGUMENT,
                 kj::str("members '", printable(at->second), "' and '", printable(t.endpoint),
                         "' are at the same address ", printable(t.address),
                         "; a server receives a blob once"));
    }
  }
  actor_detail::BlobParams params;
  params.name = name;
  params.version = version;
  params.transfer = newTransferId();
  params.chunkBytes = options.chunkBytes;
  params.windowBytes = options.windowBytes;
  params.stallTimeout = options.stallTimeout;
  params.channel = kj::mv(options.channel);
  params.sameHostReads = options.sameHostReads;
  uint64_t size = bytes.size();
  auto source = kj::refcounted<actor_detail::BlobSource>(
      kj::mv(bytes), size, options.chunkBytes, size, kj::mv(options.device), options.windowBytes);
  auto roots = actor_detail::layOut(targets, options.fanout, options.treeFanout);
  return BlobTransfer(kj::refcounted<actor_detail::BlobFanout>(loop, kj::mv(source), kj::mv(params),
                                                               kj::mv(roots), loop.logger()),
                      kj::mv(members));
}

}  // namespace troupe
