#pragma once
// The server's memory of calls sent as ExactlyOnce (schemas/actor.capnp): per caller, the calls
// in progress and the replies not yet acknowledged, so that a call retried after its connection
// broke attaches to the call in progress or gets the kept reply instead of running again. What
// it keeps is bounded (ReplyCacheOptions); a retry it can no longer answer gets MAY_HAVE_RUN,
// never a second run.
//
// Each caller has a floor: every retried call below it may have run and been forgotten. The
// floor rises as the caller acknowledges replies and as the cache drops replies to stay within
// its bounds, and a caller the server does not know gets one from its hello (ActorHost.getActor)
// or from its first call. So a retry for a call the server never saw runs, and one for a call it
// may have forgotten does not.

#include <cstdint>
#include <map>
#include <unordered_map>

#include <capnp/any.h>
#include <capnp/list.h>
#include <capnp/message.h>
#include <kj/async.h>
#include <kj/list.h>
#include <kj/timer.h>
#include <kj/vector.h>

#include "troupe/actor/actor_server.h"

namespace troupe::actor_detail {

// One call's reply as kept: its results, or the error it ended with.
class StoredReply final : public kj::Refcounted {
public:
  // A copy of `results`.
  static kj::Own<StoredReply> copyOf(capnp::AnyPointer::Reader results);
  // `results` read where they are, in the message `holder` keeps (retainOutgoingMessage(),
  // net/bytes.h), which takes `bytes` of memory.
  StoredReply(capnp::AnyPointer::Reader results, kj::Own<void> holder, uint64_t bytes);
  // Results as one flat message (capnp/serialize.h).
  explicit StoredReply(kj::Array<capnp::word> flat);
  // Results built in `message` (its root); kept as one flat array when they are small and carry
  // no capability, which takes the least memory, else in `message` itself.
  explicit StoredReply(kj::Own<capnp::MallocMessageBuilder> message);
  // The error the call ended with.
  explicit StoredReply(kj::Exception&& error);
  // The call ran and answered with results of `bytes`, too large to keep
  // (ReplyCacheOptions::maxReplyBytes).
  static kj::Own<StoredReply> notKept(uint64_t bytes);
  kj::Own<StoredReply> addRef() { return kj::addRef(*this); }

  // The error the call ended with, if it did.
  kj::Maybe<const kj::Exception&> failure() const;
  // The size of the results the call answered with when they were not kept.
  kj::Maybe<uint64_t> unkept() const { return unkeptBytes; }
  // Copies the results into `out` (when there is no failure() and they were kept).
  void copyTo(capnp::AnyPointer::Builder out) const;
  // The capability at `ops` in the results (for calls pipelined on them); broken when there is
  // none.
  kj::Own<capnp::ClientHook> pipelinedCap(kj::ArrayPtr<const capnp::PipelineOp> ops) const;
  // Memory held, in bytes, bookkeeping included.
  size_t bytes() const;

private:
  kj::Array<capnp::word> flat;     // small results without capabilities, as one flat message
  kj::Own<void> message;           // other results: what holds the memory root lies in
  capnp::AnyPointer::Reader root;  // the results, when message holds them
  kj::Maybe<kj::Own<kj::Exception>> error;
  kj::Maybe<uint64_t> unkeptBytes;
  size_t size = 0;  // bytes of flat, message or error
};

// A call's id as it arrived (ExactlyOnce.call).
struct OnceCallId {
  uint64_t callerId;
  uint64_t seq;
  uint64_t incarnation;
  bool retry;
};

// Loop thread only. Belongs to one ActorServer, for all its actors (a caller id is one client
// handle to one actor).
class ReplyCache {
  struct Caller;

public:
  ReplyCache(kj::Timer& timer, uint64_t incarnation, ReplyCacheOptions options);
  ~ReplyCache() noexcept(false);
  KJ_DISALLOW_COPY(ReplyCache);

  // A caller introduced itself (CallerHello).
  void hello(uint64_t callerId, uint64_t floor);

  // Call `id` arrived, saying that its caller has every reply below `ackBelow` and those in
  // `acks`: those are dropped. Then the reply to call `id` when it is known: kept, or coming (the
  // call is in progress: the promise is one of its waiters, see start()). Rejects with
  // MAY_HAVE_RUN for a retry that can no longer be told from a call that ran. Null when the call
  // is to run now: start() it at once, run it and hold() its work.
  kj::Maybe<kj::Promise<kj::Own<StoredReply>>> find(const OnceCallId& id, uint64_t ackBelow = 0,
                                                    capnp::List<uint64_t>::Reader acks = {});

  // Whether the cache keeps anything (ReplyCacheOptions::enabled): start() only then.
  bool enabled() const { return options.enabled; }

  // Entry and Waiter are the cache's own: callers only name an Entry start() gave them, while
  // the call runs. Loop thread only.
  struct Entry;
  // An attempt waiting for a call in progress: the adapter of its promise, listed in the call's
  // entry until the call finishes or the attempt is dropped.
  class Waiter {
  public:
    Waiter(kj::PromiseFulfiller<kj::Own<StoredReply>>& fulfiller, ReplyCache& cache, Entry& entry);
    ~Waiter() noexcept(false);
    KJ_DISALLOW_COPY(Waiter);

    kj::PromiseFulfiller<kj::Own<StoredReply>>& fulfiller;
    ReplyCache& cache;
    Entry& entry;
    kj::ListLink<Waiter> link;
  };
  // One call of a caller: in progress (running), or finished with its reply kept. Owned by its
  // caller's map, in the node (it never moves).
  struct Entry {
    Entry(Caller& caller, uint64_t seq) : caller(caller), seq(seq) {}
    KJ_DISALLOW_COPY(Entry);
    Caller& caller;
    uint64_t seq;
    // While in progress: its work, whether it may be cancelled, who waits for its reply, and the
    // reconnect window while no one does.
    bool running = false;
    kj::Promise<void> work = nullptr;
    kj::Maybe<const bool&> cancellable;
    kj::List<Waiter, &Waiter::link> waiters;
    kj::Promise<void> abandoning = nullptr;
    kj::Own<StoredReply> reply;  // once finished
    uint64_t bytes = 0;          // counted in the caller's and the cache's bytes, once finished
    kj::TimePoint finishedAt = kj::origin<kj::TimePoint>();
    kj::ListLink<Entry> link;  // in `completed`, once finished
  };
  // A call start() keeps: the reply for the attempt that started it (its first waiter), and
  // the entry to hold() its work and give it its reply (finished()).
  struct Started {
    kj::Promise<kj::Own<StoredReply>> reply;
    Entry& entry;
  };
  // Keeps call `id`, which runs now: give it the call's work (hold()) and its reply once the
  // call ends (finished()). `cancellable` (kept by the work) says whether cancel() may drop it.
  // The promises returned for a call in progress (here and by find()) are its waiters: once
  // every one is dropped (their connections broke) and none comes within the reconnect window
  // (ReplyCacheOptions::reconnectWindow), the call is cancelled as by cancel().
  Started start(const OnceCallId& id, const bool& cancellable);
  Started start(const OnceCallId& id, const bool&& cancellable) = delete;
  // Holds the work of call `entry` in progress, so that it runs to its end even when its
  // connection breaks; dropping it cancels the call.
  void hold(Entry& entry, kj::Promise<void> work);
  // Call `entry` in progress ended with `reply` (an error it ended with included): its waiters
  // get it, and it is kept. May run inside the call's work.
  void finished(Entry& entry, kj::Own<StoredReply> reply);

  // The caller gave up on call (callerId, seq): a call in progress that may be cancelled is
  // dropped, and its waiters get an error saying so.
  void cancel(uint64_t callerId, uint64_t seq);

  // Drops every call in progress and every reply (the server is going away).
  void clear();

  struct Stats {
    uint64_t callers = 0;
    uint64_t running = 0;
    uint64_t replies = 0;    // kept, not running
    uint64_t bytes = 0;      // of kept replies and callers' bookkeeping
    uint64_t replayed = 0;   // retries answered from a kept or running call
    uint64_t forgotten = 0;  // retries answered MAY_HAVE_RUN
  };
  const Stats& stats() const { return stats_; }
  // The largest reply kept (ReplyCacheOptions::maxReplyBytes).
  uint64_t maxReplyBytes() const { return options.maxReplyBytes; }

private:
  struct Caller {
    Caller(uint64_t id, uint64_t floor, kj::TimePoint now) : id(id), floor(floor), lastSeen(now) {}
    uint64_t id;
    uint64_t floor;  // a retry below it, of a call not kept, may have run
    std::map<uint64_t, Entry> entries;
    uint64_t bytes = 0;  // of its kept replies
    uint32_t kept = 0;   // its finished entries
    kj::TimePoint lastSeen;
    kj::ListLink<Caller> idleLink;  // in `idle` while it has no entries
  };

  // A waiter of `entry`, in progress.
  kj::Promise<kj::Own<StoredReply>> waiter(Entry& entry);
  // The last waiter of `entry`, in progress, was dropped.
  void leftBy(Entry& entry);
  // Cancels call `entry` when it is in progress, may be cancelled and has no waiter.
  void abandon(Entry& entry);
  // Ends call `entry` in progress with `error`, dropping its work (which cancels it).
  void stopRunning(Entry& entry, kj::Exception&& error);
  // Caller `callerId`, known or new (with `floor`, seen now).
  Caller& callerFor(uint64_t callerId, uint64_t floor);
  kj::Maybe<Caller&> knownCaller(uint64_t callerId);
  // `caller` has every reply below `below` and those in `acks`.
  void acknowledge(Caller& caller, uint64_t below, capnp::List<uint64_t>::Reader acks);
  // Drops a finished entry; `forget`: raise its caller's floor past it.
  void drop(Entry& entry, bool forget);
  // Keeps within the bounds, dropping the oldest replies first (never `keep`, nor calls in
  // progress), then the callers longest idle.
  void enforce(kj::Maybe<Entry&> keep);
  void dropCaller(Caller& caller);
  void becameIdle(Caller& caller);
  void touch(Caller& caller);
  void sweep();
  kj::Promise<void> sweeping();
  kj::Exception forgottenError(const OnceCallId& id, kj::StringPtr why);

  kj::Timer& timer;
  const uint64_t incarnation;
  const ReplyCacheOptions options;
  std::unordered_map<uint64_t, kj::Own<Caller>> callers;
  kj::List<Entry, &Entry::link> completed;   // finished entries, oldest first
  kj::List<Caller, &Caller::idleLink> idle;  // callers without entries, longest idle first
  // Finished work and expired reconnect windows, freed outside their own continuations.
  kj::Vector<kj::Promise<void>> spent;
  Stats stats_;
  kj::Promise<void> sweeper = nullptr;
  bool sweeperActive = false;
};

}  // namespace troupe::actor_detail
