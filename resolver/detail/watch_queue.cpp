#include "troupe/resolver/detail/watch_queue.h"

#include <kj/debug.h>

namespace troupe::detail {

kj::Promise<WatchEvent> WatchQueue::next() {
  KJ_IF_MAYBE(w, waiter) {
    KJ_REQUIRE(!(*w)->isWaiting(), "Watch::next() called while an earlier next() is pending");
    waiter = nullptr;  // that next() promise was dropped
  }
  if (!queue.empty()) {
    WatchEvent event = kj::mv(queue.front());
    queue.pop_front();
    return kj::mv(event);
  }
  KJ_IF_MAYBE(e, endError) {
    return kj::cp(*e);
  }
  auto paf = kj::newPromiseAndFulfiller<WatchEvent>();
  waiter = kj::mv(paf.fulfiller);
  return kj::mv(paf.promise);
}

void WatchQueue::push(WatchEvent event) {
  KJ_IF_MAYBE(w, waiter) {
    auto fulfiller = kj::mv(*w);
    waiter = nullptr;
    if (fulfiller->isWaiting()) {
      KJ_ASSERT(queue.empty());
      fulfiller->fulfill(kj::mv(event));
      return;
    }
  }
  queue.push_back(kj::mv(event));
}

void WatchQueue::end(kj::Exception reason) {
  endError = kj::cp(reason);
  KJ_IF_MAYBE(w, waiter) {
    auto fulfiller = kj::mv(*w);
    waiter = nullptr;
    if (fulfiller->isWaiting()) fulfiller->reject(kj::mv(reason));
  }
}

}  // namespace troupe::detail
