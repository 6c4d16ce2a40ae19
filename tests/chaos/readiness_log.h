#pragma once
// ReadinessLog: how many members of a group were READY, and since when.

#include <vector>

#include <kj/async.h>
#include <kj/time.h>

#include "troupe/pool/actor_group.h"

namespace troupe::chaos {

// Follows `group` (borrowed; it must outlive this) through its whenChanged(), on its loop, and
// records each change of its READY count with the loop's time. Dropping it stops following.
class ReadinessLog {
public:
  explicit ReadinessLog(ActorGroupBase& group);
  KJ_DISALLOW_COPY(ReadinessLog);

  // The most members READY at any moment in [from, to].
  size_t mostReadyBetween(kj::TimePoint from, kj::TimePoint to) const;

private:
  struct Change {
    kj::TimePoint at;
    size_t ready;
  };
  kj::Promise<void> follow();

  ActorGroupBase& group;
  std::vector<Change> changes;  // in time order; the first is the count when this was made
  kj::Promise<void> following = nullptr;
};

}  // namespace troupe::chaos
