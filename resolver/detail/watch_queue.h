#pragma once
// WatchQueue: the queue behind a Watch, shared by the resolvers' watch implementations.

#include <deque>

#include <kj/async.h>

#include "troupe/base/change_signal.h"
#include "troupe/resolver/resolver.h"

namespace troupe::resolver_detail {

// Events a resolver pushed and the watch's user has not taken yet, in order, none dropped.
// Loop thread only. Dropping it rejects a pending next().
class WatchQueue {
public:
  WatchQueue() = default;
  ~WatchQueue() noexcept(false);
  KJ_DISALLOW_COPY(WatchQueue);

  // The oldest event; when there is none, a promise for the next one pushed, or, once end()
  // was called, the end's error.
  kj::Promise<WatchEvent> next();

  // Hands `event` to the pending next(), or queues it.
  void push(WatchEvent event);

  // No more events will come: a pending next() rejects with `reason`, later ones once the
  // queued events were taken.
  void end(kj::Exception reason);

private:
  std::deque<WatchEvent> queue;
  kj::Maybe<kj::Exception> endError;
  ChangeSignal pushed;   // an event was pushed, or the queue ended
  kj::Canceler waiting;  // last: a pending next() refers to the queue
};

}  // namespace troupe::resolver_detail
