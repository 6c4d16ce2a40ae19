#include "troupe/actor/detail/reply_cache.h"

#include <string.h>

#include <algorithm>

#include <capnp/serialize.h>
#include <kj/debug.h>

#include "troupe/base/errors.h"

namespace troupe::actor_detail {

namespace {

// What a caller's bookkeeping and an entry's cost beyond their reply, roughly: the structs, the
// map node and the allocator's headers.
constexpr uint64_t CALLER_BYTES = 160;
// Results up to this size are kept flat (copied once more, to a compact array); larger ones stay
// in the message they were copied to, whose one segment they fill.
constexpr uint64_t MAX_FLAT_BYTES = 64 << 10;
// The largest first segment of a kept reply's message (2 GiB; larger results take more segments).
constexpr uint64_t MAX_FIRST_SEGMENT_WORDS = uint64_t(1) << 28;
// Set so that the bytes counted for a small kept reply match the memory it takes
// (bench/memory_bench.cpp, BM_Troupe_KeptReplies: 461 bytes of RSS per 64-byte echo's reply).
constexpr uint64_t ENTRY_BYTES = 245;

// Whether results of `target` size are kept as one flat array (small, and no capabilities).
bool keptFlat(capnp::MessageSize target) {
  return target.capCount == 0 && target.wordCount * sizeof(capnp::word) <= MAX_FLAT_BYTES;
}

// Ends every waiter of call `e` with what `tell` gives its fulfiller, each unlinked first (so
// that its destructor leaves the entry alone).
template <typename Tell>
void endWaiters(ReplyCache::Entry& e, Tell&& tell) {
  while (!e.waiters.empty()) {
    auto& w = e.waiters.front();
    e.waiters.remove(w);
    tell(w.fulfiller);
  }
}

}  // namespace

// ------------------------------------------------------------------------------------------------

kj::Own<StoredReply> StoredReply::copyOf(capnp::AnyPointer::Reader results) {
  auto target = results.targetSize();
  if (keptFlat(target)) {
    // Built in this thread's scratch segment, which the builder zeroes again as it goes, and
    // flattened from there: one allocation, the flat array.
    static thread_local auto scratch = kj::heapArray<capnp::word>(
        MAX_FLAT_BYTES / sizeof(capnp::word) + 8);
    static thread_local bool zeroed = false;
    if (!zeroed) {
      memset(static_cast<void*>(scratch.begin()), 0, scratch.asBytes().size());
      zeroed = true;
    }
    capnp::MallocMessageBuilder builder(scratch);
    builder.getRoot<capnp::AnyPointer>().set(results);
    return kj::refcounted<StoredReply>(capnp::messageToFlatArray(builder));
  }
  // One segment with room for them exactly: no slack to keep.
  auto words = kj::min(target.wordCount + 1, MAX_FIRST_SEGMENT_WORDS);
  auto message = kj::heap<capnp::MallocMessageBuilder>(static_cast<uint>(words));
  message->getRoot<capnp::AnyPointer>().set(results);
  return kj::refcounted<StoredReply>(kj::mv(message));
}

StoredReply::StoredReply(capnp::AnyPointer::Reader results, kj::Own<void> holder, uint64_t bytes)
    : message(kj::mv(holder)), root(results), size(bytes) {}

StoredReply::StoredReply(kj::Array<capnp::word> flat)
    : flat(kj::mv(flat)), size(this->flat.size() * sizeof(capnp::word)) {}

StoredReply::StoredReply(kj::Own<capnp::MallocMessageBuilder> built) {
  auto results = built->getRoot<capnp::AnyPointer>().asReader();
  if (keptFlat(results.targetSize())) {
    flat = capnp::messageToFlatArray(*built);
    size = flat.size() * sizeof(capnp::word);
  } else {
    size = sizeof(capnp::MallocMessageBuilder);
    for (auto segment : built->getSegmentsForOutput()) size += segment.size() * sizeof(capnp::word);
    root = results;
    message = kj::mv(built);
  }
}

StoredReply::StoredReply(kj::Exception&& e) : error(kj::heap(kj::mv(e))) {
  size = sizeof(kj::Exception) + KJ_ASSERT_NONNULL(error)->getDescription().size();
}

kj::Own<StoredReply> StoredReply::notKept(uint64_t bytes) {
  auto reply = kj::refcounted<StoredReply>(kj::heap<capnp::MallocMessageBuilder>(1));
  reply->unkeptBytes = bytes;
  return reply;
}

kj::Maybe<const kj::Exception&> StoredReply::failure() const {
  KJ_IF_MAYBE(e, error) {
    return **e;
  }
  return nullptr;
}

void StoredReply::copyTo(capnp::AnyPointer::Builder out) const {
  if (message != nullptr) {
    out.set(root);
  } else if (flat.size() > 0) {
    capnp::ReaderOptions options;
    options.traversalLimitInWords = kj::maxValue;
    capnp::FlatArrayMessageReader reader(flat, options);
    out.set(reader.getRoot<capnp::AnyPointer>());
  }
}

kj::Own<capnp::ClientHook> StoredReply::pipelinedCap(
    kj::ArrayPtr<const capnp::PipelineOp> ops) const {
  if (message != nullptr) return root.getPipelinedCap(ops);
  return capnp::newBrokenCap("the call's results hold no capability there");
}

size_t StoredReply::bytes() const { return sizeof(*this) + size; }

// ------------------------------------------------------------------------------------------------

ReplyCache::ReplyCache(kj::Timer& timer, uint64_t incarnation, ReplyCacheOptions options)
    : timer(timer), incarnation(incarnation), options(options) {}

ReplyCache::~ReplyCache() noexcept(false) { clear(); }

void ReplyCache::clear() {
  while (!callers.empty()) dropCaller(*callers.begin()->second);
  spent.clear();
  sweeper = nullptr;
  sweeperActive = false;
}

kj::Maybe<ReplyCache::Caller&> ReplyCache::knownCaller(uint64_t callerId) {
  auto it = callers.find(callerId);
  if (it == callers.end()) return nullptr;
  return *it->second;
}

ReplyCache::Caller& ReplyCache::callerFor(uint64_t callerId, uint64_t floor) {
  KJ_IF_MAYBE(c, knownCaller(callerId)) {
    return *c;
  }
  enforce(nullptr);
  auto owned = kj::heap<Caller>(callerId, floor, timer.now());
  auto& c = *owned;
  callers.emplace(callerId, kj::mv(owned));
  stats_.callers = callers.size();
  stats_.bytes += CALLER_BYTES;
  idle.add(c);
  if (!sweeperActive) {
    sweeperActive = true;
    sweeper = sweeping().eagerlyEvaluate(nullptr);
  }
  return c;
}

void ReplyCache::touch(Caller& caller) {
  caller.lastSeen = timer.now();
  if (caller.idleLink.isLinked()) {
    idle.remove(caller);
    idle.add(caller);
  }
}

void ReplyCache::hello(uint64_t callerId, uint64_t floor) {
  spent.clear();
  if (!options.enabled || callerId == 0) return;
  touch(callerFor(callerId, floor));
}

void ReplyCache::acknowledge(Caller& c, uint64_t below, capnp::List<uint64_t>::Reader acks) {
  for (uint64_t seq : acks) {
    auto it = c.entries.find(seq);
    if (it != c.entries.end() && !it->second.running) drop(it->second, false);
    if (c.entries.empty()) break;
  }
  c.floor = std::max(c.floor, below);
  while (!c.entries.empty()) {
    auto& first = c.entries.begin()->second;
    if (first.seq >= below || first.running) break;
    drop(first, false);
  }
}

kj::Exception ReplyCache::forgottenError(const OnceCallId& id, kj::StringPtr why) {
  ++stats_.forgotten;
  return makeError(ErrorCode::MAY_HAVE_RUN,
                   kj::str("the call was sent again after its connection broke, and ", why,
                           "; it was not run again (caller ", id.callerId, ", call ", id.seq, ")"));
}

kj::Maybe<kj::Promise<kj::Own<StoredReply>>> ReplyCache::find(const OnceCallId& id,
                                                              uint64_t ackBelow,
                                                              capnp::List<uint64_t>::Reader acks) {
  spent.clear();
  // Looked up once: acknowledging never drops the caller itself.
  auto caller = knownCaller(id.callerId);
  KJ_IF_MAYBE(c, caller) {
    touch(*c);
    acknowledge(*c, ackBelow, acks);
  }
  if (id.retry && id.incarnation != incarnation) {
    return kj::Promise<kj::Own<StoredReply>>(
        forgottenError(id, kj::str("it was first sent to incarnation ", id.incarnation,
                                   " of this server, which ", "is now incarnation ", incarnation)));
  }
  if (!options.enabled) {
    if (!id.retry) return nullptr;
    return kj::Promise<kj::Own<StoredReply>>(
        forgottenError(id, "this server keeps no replies (ReplyCacheOptions::enabled)"));
  }
  KJ_IF_MAYBE(c, caller) {
    auto it = c->entries.find(id.seq);
    if (it != c->entries.end()) {
      auto& e = it->second;
      if (!id.retry) {
        // A first attempt is sent once; a second with its id is a caller's bug.
        return kj::Promise<kj::Own<StoredReply>>(makeError(
            ErrorCode::INVALID_ARGUMENT, kj::str("call ", id.seq, " of caller ", id.callerId,
                                                 " was sent twice as a first attempt")));
      }
      ++stats_.replayed;
      if (e.running) return waiter(e);
      return kj::Promise<kj::Own<StoredReply>>(e.reply->addRef());
    }
    if (!id.retry) return nullptr;
    if (id.seq < c->floor) {
      return kj::Promise<kj::Own<StoredReply>>(
          forgottenError(id, "its reply is no longer kept here (acknowledged, past the "
                             "retention time, or dropped for the cache's bounds)"));
    }
    return nullptr;  // the earlier attempt never arrived
  }
  if (!id.retry) return nullptr;
  return kj::Promise<kj::Own<StoredReply>>(forgottenError(
      id, "this server no longer knows the caller (its replies were dropped after the retention "
          "time or for the cache's bounds)"));
}

ReplyCache::Started ReplyCache::start(const OnceCallId& id, const bool& cancellable) {
  KJ_REQUIRE(options.enabled);
  // find() has just touched a caller it knows.
  auto& c = callerFor(id.callerId, id.seq);
  if (c.idleLink.isLinked()) idle.remove(c);
  auto [it, inserted] = c.entries.emplace(std::piecewise_construct, std::forward_as_tuple(id.seq),
                                          std::forward_as_tuple(c, id.seq));
  KJ_ASSERT(inserted, "a call started twice", id.callerId, id.seq);
  auto& e = it->second;
  ++stats_.running;
  e.running = true;
  e.cancellable = cancellable;
  return {waiter(e), e};
}

void ReplyCache::hold(Entry& e, kj::Promise<void> work) {
  if (e.running) e.work = kj::mv(work);
}

void ReplyCache::finished(Entry& e, kj::Own<StoredReply> reply) {
  KJ_ASSERT(e.running);
  e.running = false;
  --stats_.running;
  // This may run inside `work`'s own continuation: free it later.
  spent.add(kj::mv(e.work));
  e.abandoning = nullptr;
  e.cancellable = nullptr;
  endWaiters(e, [&](auto& fulfiller) { fulfiller.fulfill(reply->addRef()); });
  e.reply = kj::mv(reply);
  e.bytes = e.reply->bytes() + ENTRY_BYTES;
  e.finishedAt = timer.now();
  e.caller.bytes += e.bytes;
  ++e.caller.kept;
  stats_.bytes += e.bytes;
  ++stats_.replies;
  completed.add(e);
  enforce(e);
}

ReplyCache::Waiter::Waiter(kj::PromiseFulfiller<kj::Own<StoredReply>>& fulfiller, ReplyCache& cache,
                           Entry& entry)
    : fulfiller(fulfiller), cache(cache), entry(entry) {
  entry.waiters.add(*this);
  entry.abandoning = nullptr;
}

ReplyCache::Waiter::~Waiter() noexcept(false) {
  // Unlinked once the call finished, or the cache dropped it.
  if (!link.isLinked()) return;
  entry.waiters.remove(*this);
  if (entry.waiters.empty()) cache.leftBy(entry);
}

kj::Promise<kj::Own<StoredReply>> ReplyCache::waiter(Entry& e) {
  return kj::newAdaptedPromise<kj::Own<StoredReply>, Waiter>(*this, e);
}

void ReplyCache::leftBy(Entry& e) {
  e.abandoning = timer.afterDelay(options.reconnectWindow)
                     .then([this, &e]() { abandon(e); })
                     .eagerlyEvaluate(nullptr);
}

void ReplyCache::abandon(Entry& e) {
  // This runs inside the reconnect window's continuation: free it later.
  spent.add(kj::mv(e.abandoning));
  if (!e.running || !e.waiters.empty() || !KJ_ASSERT_NONNULL(e.cancellable)) return;
  stopRunning(e, makeError(ErrorCode::MAY_HAVE_RUN,
                           kj::str("the call was cancelled while it ran: its caller's "
                                   "connection broke and it did not come back within ",
                                   options.reconnectWindow)));
}

void ReplyCache::cancel(uint64_t callerId, uint64_t seq) {
  spent.clear();
  KJ_IF_MAYBE(c, knownCaller(callerId)) {
    auto it = c->entries.find(seq);
    if (it == c->entries.end()) return;
    auto& e = it->second;
    if (!e.running || !KJ_ASSERT_NONNULL(e.cancellable)) return;
    stopRunning(e, makeError(ErrorCode::FAILED, "the call was cancelled by its caller"));
  }
}

void ReplyCache::stopRunning(Entry& e, kj::Exception&& error) {
  // Dropping the work cancels the call at the gate, as Cap'n Proto does for a plain call.
  e.work = nullptr;
  finished(e, kj::refcounted<StoredReply>(kj::mv(error)));
}

void ReplyCache::drop(Entry& e, bool forget) {
  auto& c = e.caller;
  KJ_ASSERT(!e.running);
  if (forget) c.floor = std::max(c.floor, e.seq + 1);
  completed.remove(e);
  c.bytes -= e.bytes;
  --c.kept;
  stats_.bytes -= e.bytes;
  --stats_.replies;
  c.entries.erase(e.seq);  // destroys e
  if (c.entries.empty()) becameIdle(c);
}

void ReplyCache::becameIdle(Caller& c) {
  c.lastSeen = timer.now();
  idle.add(c);
}

void ReplyCache::dropCaller(Caller& c) {
  for (auto& [seq, e] : c.entries) {
    if (e.running) {
      e.work = nullptr;
      e.abandoning = nullptr;
      auto error = makeError(ErrorCode::FAILED, "the server dropped the call: it is going away");
      endWaiters(e, [&](auto& fulfiller) { fulfiller.reject(kj::cp(error)); });
      --stats_.running;
    } else {
      completed.remove(e);
      stats_.bytes -= e.bytes;
      --stats_.replies;
    }
  }
  if (c.idleLink.isLinked()) idle.remove(c);
  stats_.bytes -= CALLER_BYTES;
  callers.erase(c.id);  // destroys c
  stats_.callers = callers.size();
}

void ReplyCache::enforce(kj::Maybe<Entry&> keep) {
  auto isKept = [&](Entry& e) {
    KJ_IF_MAYBE(k, keep) {
      return k == &e;
    }
    return false;
  };
  // Per caller: the oldest of its replies go first.
  KJ_IF_MAYBE(k, keep) {
    auto& c = k->caller;
    auto it = c.entries.begin();
    while ((c.kept > options.maxRepliesPerCaller || c.bytes > options.maxBytesPerCaller) &&
           it != c.entries.end()) {
      auto& e = (it++)->second;
      if (!e.running && !isKept(e)) drop(e, true);
    }
  }
  // In all: the replies finished longest ago go first, then the callers idle longest.
  auto over = [&]() {
    return stats_.replies > options.maxReplies || stats_.bytes > options.maxBytes;
  };
  auto e = completed.begin();
  while (over() && e != completed.end()) {
    auto& victim = *(e++);
    if (!isKept(victim)) drop(victim, true);
  }
  while (stats_.bytes > options.maxBytes && !idle.empty()) dropCaller(idle.front());
}

void ReplyCache::sweep() {
  spent.clear();
  auto now = timer.now();
  while (!completed.empty() && completed.front().finishedAt + options.retention <= now) {
    drop(completed.front(), true);
  }
  while (!idle.empty() && idle.front().lastSeen + options.retention <= now) {
    dropCaller(idle.front());
  }
}

kj::Promise<void> ReplyCache::sweeping() {
  auto every = std::max(options.retention / 8, 1 * kj::SECONDS);
  return timer.afterDelay(every).then([this]() -> kj::Promise<void> {
    sweep();
    if (callers.empty()) {
      // Resumes with the next caller, which replaces this promise.
      sweeperActive = false;
      return kj::NEVER_DONE;
    }
    return sweeping();
  });
}

}  // namespace troupe::actor_detail
