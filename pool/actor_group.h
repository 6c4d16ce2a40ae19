#pragma once
// ActorGroup<T>: the replicas of one job that host actor `name`, found through a resolver and
// kept current by its watch.
//
//   troupe::ActorGroup<ParameterServer> group(loop, *resolver, "job-42", "ps");
//   auto members = group.waitReady(4, 30 * kj::SECONDS).wait(loop.waitScope());

#include <map>
#include <memory>
#include <string>
#include <vector>

#include <kj/async.h>
#include <kj/function.h>
#include <kj/refcount.h>

#include "troupe/actor/actor_ref.h"
#include "troupe/actor/endpoint.h"
#include "troupe/base/event_loop.h"
#include "troupe/resolver/resolver.h"

namespace troupe {

struct ActorGroupOptions {
  // Settings for the connections to members (one per member address, shared by every actor
  // reached there).
  ChannelOptions channel;

  // Whether a member on this host, in this network namespace, whose server publishes a same-host
  // socket of this user's (ActorServerOptions::sameHost) is called through that socket rather
  // than the address it publishes (connectAddress(), actor/endpoint.h). Default true.
  bool sameHost = true;

  // Where the group logs membership changes. Default: the loop's logger.
  std::shared_ptr<spdlog::logger> logger;
};

// One member as the group saw it when it handed the member out: its endpoint and a handle to its
// actor (sharing the group's connection to the member's address). A snapshot: when the resolver
// reports the member differently, the group makes a new GroupMember and leaves this one as it
// is. Held by reference count (kj::Own); a holder may keep it, and calls made through its
// handle, for as long as it likes, also after the member left the group or the group is gone
// (calls then fail as calls to a server that went away do). Loop thread only.
struct GroupMember final : public kj::Refcounted {
  GroupMember(Endpoint endpoint, ActorRefBase ref) : endpoint(kj::mv(endpoint)), ref(kj::mv(ref)) {}

  const Endpoint endpoint;
  // Copy it to call (copies share the connection): ActorRef<T>(member->ref).call(...).
  const ActorRefBase ref;
};

// The untyped part of ActorGroup<T>. Belongs to the loop it was made on; borrows the resolver,
// which must outlive it.
class ActorGroupBase {
public:
  ActorGroupBase(EventLoop& loop, Resolver& resolver, kj::StringPtr jobId, kj::StringPtr actor,
                 ActorGroupOptions options = {});
  ~ActorGroupBase() noexcept(false);
  KJ_DISALLOW_COPY(ActorGroupBase);

  // Resolves as soon as `count` members are READY, with those members (sorted by name), which
  // count as handed out (see discoverNew()). Rejects with JOB_ENDED at once when the job ends
  // (or has ended), saying how many members had registered and were ready before it ended (the
  // end removes them), and with DEADLINE_EXCEEDED after `timeout`, saying how many were ready
  // and which were not. Dropping the promise cancels the wait; destroying the group rejects it.
  kj::Promise<kj::Array<Endpoint>> waitReady(size_t count, kj::Duration timeout);

  // The READY members not handed out before by waitReady() or discoverNew(), sorted by name; a
  // member that restarted (new incarnation) counts as new. Marks them handed out.
  kj::Array<Endpoint> discoverNew();

  // How many members are READY now.
  size_t readyCount() const;

  // Every member the resolver lists, in any state, sorted by name.
  kj::Array<Endpoint> members() const;

  // Asks every member's server to drain (ActorHost.drain: finish its calls in flight within
  // `grace`, default each server's own, then stop). Resolves when every request was answered or
  // failed; the members then leave the resolver as they stop. The group itself goes on
  // following the job. Each request presents the channel's credentials' job credential for this
  // group's job (ChannelOptions::credentials, or the loop's: TROUPE_JOB_TOKEN_FILE with
  // TROUPE_JOB_ID); a member refuses without it (PERMISSION_DENIED, logged here).
  kj::Promise<void> drainMembers(kj::Maybe<kj::Duration> grace = nullptr);

  // The job's end, once the resolver reported it. A job of the same name that runs again (a
  // member registers: the resolver admits registrations only to jobs that have not ended)
  // clears it.
  kj::Maybe<const JobStatus&> jobEnded() const;

  // Resolves at the next membership change (a member added, changed or removed, or the job
  // ended). For pools that wait for a member to become ready.
  kj::Promise<void> whenChanged();

  // Resolves once the group holds the resolver's view of its members (its watch reported what
  // was there when the group was made), at once after that; rejects when the watch ends, or
  // when the group is destroyed first. For a program that acts on whatever members there are.
  kj::Promise<void> whenSynced();

  // The READY members now, in name order, each with a handle to its actor (see GroupMember).
  kj::Array<kj::Own<const GroupMember>> readyMembers();

  // The READY member at `index` (0 <= index < readyCount()) in name order, without building
  // the whole list: what a pool picks from on every call.
  kj::Own<const GroupMember> readyMember(size_t index);

  // The job and actor the group follows, and the loop it belongs to.
  kj::StringPtr jobId() const;
  // ActorGroupOptions::sameHost: members on this host are called through their same-host socket.
  bool callsSameHost() const;
  kj::StringPtr actorName() const;
  EventLoop& loop();

private:
  struct Impl;
  kj::Own<Impl> impl;
};

// A group of actors implementing Cap'n Proto interface T.
template <typename T>
class ActorGroup : public ActorGroupBase {
public:
  using ActorGroupBase::ActorGroupBase;
};

}  // namespace troupe
