#pragma once
// What one ActorPool knows of its members' health: which member failed how often in a row, which
// is ejected until when, and the pings that decide whether a silent or ejected member answers.
// The pool asks it before every pick and tells it how every attempt ended. See the options in
// ActorPoolOptions (attemptTimeout, probeAfter, probeTimeout, ejection).

#include <map>
#include <string>

#include <kj/async.h>
#include <kj/list.h>

#include "troupe/base/change_signal.h"
#include "troupe/pool/actor_group.h"
#include "troupe/pool/actor_pool.h"

namespace troupe::pool_detail {

// Loop thread only. Keyed by member name; a record for an older incarnation of a name is
// forgotten when the new one shows up, since a restarted process owes nothing to the old one.
class MemberHealth final : private kj::TaskSet::ErrorHandler {
public:
  MemberHealth(EventLoop& loop, const ActorPoolOptions& options);
  ~MemberHealth() noexcept(false);
  KJ_DISALLOW_COPY(MemberHealth);

  // True when `member` takes new calls: it is not ejected. When its ejection period is over, this
  // pings it (once) and says false until the ping answers.
  bool available(const GroupMember& member);

  // An attempt on `member` finished (an answer, or an error its actor raised: the member works).
  void succeeded(const GroupMember& member);

  // An attempt on `member` failed in a way that is the member's or its connection's fault
  // (`why` says how, for the log). Enough of them in a row eject it.
  void failed(const GroupMember& member, const kj::Exception& why);

  // Watches an attempt on `member` that has just been sent. Rejects with DEADLINE_EXCEEDED (the
  // attempt may have run) when the attempt should be given up: past the attempt timeout, or once
  // a probe of the member went unanswered while the attempt waited; for an attempt that is not
  // `idempotent` it never rejects, but it still has the member probed, so that new calls avoid
  // it. Never resolves. Drop it when the attempt ends. Costs no timer of its own: one timer per
  // pool goes off when the oldest attempt waiting is due (see sweep()).
  kj::Promise<void> watch(const GroupMember& member, bool idempotent);

  // Whether the member named `name` is ejected now.
  bool ejected(kj::StringPtr name) const;

  // Whether watch() does anything at all (a probe or an attempt timeout is configured).
  bool watches(bool idempotent) const;

  // One attempt watched: the adapter of the promise watch() returns, listed while it waits.
  class Waiter {
  public:
    Waiter(kj::PromiseFulfiller<void>& fulfiller, MemberHealth& health, const GroupMember& member,
           bool idempotent);
    ~Waiter() noexcept(false);
    KJ_DISALLOW_COPY(Waiter);

    // Gives the attempt up with `why`; it is no longer listed.
    void abandon(kj::Exception&& why);

    MemberHealth& health;
    const kj::Own<const GroupMember> member;
    const bool idempotent;
    const kj::TimePoint since;  // sent then
    kj::TimePoint checkFrom;    // the next probe is due probeAfter after this
    kj::ListLink<Waiter> link;

  private:
    kj::PromiseFulfiller<void>& fulfiller;
  };

private:
  struct Record;

  Record& recordFor(const GroupMember& member);
  // Pings `member` (one ping in flight per member, shared); resolves true if it answered within
  // the probe timeout, or if it was busy (busy()). An unanswered ping ejects the member.
  kj::Promise<bool> probe(const GroupMember& member);
  // Whether a ping of `member` sent at `sentAt` that failed with `e` was late because its
  // connection was moving a large message (either way) while it waited: a timeout while bytes
  // moved, which does not count against the member.
  bool busy(const GroupMember& member, kj::TimePoint sentAt, const kj::Exception& e) const;
  void eject(Record& record, const GroupMember& member, kj::StringPtr why);
  kj::Exception abandoned(const GroupMember& member, kj::StringPtr why) const;

  // The attempts waiting: times them out and probes their members. Returns when the next of
  // them is due, if any waits.
  kj::Maybe<kj::TimePoint> sweep();
  // Has sweep() run by `due`, at the latest.
  void sweepBy(kj::TimePoint due);
  // Sweeps at `due` and then whenever the next attempt is due, while any waits.
  kj::Promise<void> sweepsFrom(kj::TimePoint due);
  // A probe of `member` made for the attempts waiting on it answered (or not).
  void probed(const GroupMember& member, bool answered);
  void taskFailed(kj::Exception&& exception) override;

  EventLoop& loop;
  const ActorPoolOptions& options;
  std::map<std::string, Record, std::less<>> records;
  kj::List<Waiter, &Waiter::link> waiting;  // oldest first
  kj::Maybe<kj::TimePoint> sweepAt;
  kj::Promise<void> sweeping = nullptr;
  kj::Own<kj::TaskSet> probes;  // the probes sweep() made
};

}  // namespace troupe::pool_detail
