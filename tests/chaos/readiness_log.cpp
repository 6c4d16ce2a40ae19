#include "tests/chaos/readiness_log.h"

#include <algorithm>

namespace troupe::chaos {

ReadinessLog::ReadinessLog(ActorGroupBase& group) : group(group) {
  changes.push_back({group.loop().timer().now(), group.readyCount()});
  following = follow().eagerlyEvaluate(nullptr);
}

kj::Promise<void> ReadinessLog::follow() {
  return group.whenChanged().then([this]() {
    size_t ready = group.readyCount();
    if (ready != changes.back().ready) changes.push_back({group.loop().timer().now(), ready});
    return follow();
  });
}

size_t ReadinessLog::mostReadyBetween(kj::TimePoint from, kj::TimePoint to) const {
  // The count in force at `from` is that of the last change at or before it.
  size_t most = 0;
  for (size_t i = 0; i < changes.size(); ++i) {
    bool inForceAtFrom = i + 1 == changes.size() || changes[i + 1].at > from;
    if (changes[i].at <= to && inForceAtFrom) most = std::max(most, changes[i].ready);
  }
  return most;
}

}  // namespace troupe::chaos
