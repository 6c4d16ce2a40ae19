#include "troupe/resolver/detail/watch_queue.h"

#include "troupe/base/errors.h"

namespace troupe::resolver_detail {

WatchQueue::~WatchQueue() noexcept(false) {
  waiting.cancel(makeError(ErrorCode::FAILED, "the watch was dropped while next() waited"));
}

kj::Promise<WatchEvent> WatchQueue::next() {
  if (!queue.empty()) {
    WatchEvent event = kj::mv(queue.front());
    queue.pop_front();
    return kj::mv(event);
  }
  KJ_IF_MAYBE(e, endError) {
    return kj::cp(*e);
  }
  return waiting.wrap(pushed.next().then([this]() { return next(); }));
}

void WatchQueue::push(WatchEvent event) {
  queue.push_back(kj::mv(event));
  pushed.notify();
}

void WatchQueue::end(kj::Exception reason) {
  endError = kj::mv(reason);
  pushed.notify();
}

}  // namespace troupe::resolver_detail
