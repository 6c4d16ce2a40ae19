#pragma once
// ChangeSignal: "wake me at the next change", for objects whose state others wait on.

#include <kj/async.h>
#include <kj/vector.h>

namespace troupe {

// Loop thread only. Waiters whose promise was dropped are forgotten at the next next(), so
// abandoned waits (a wait that timed out) do not pile up.
class ChangeSignal {
public:
  // Resolves at the next notify().
  kj::Promise<void> next() {
    kj::Vector<kj::Own<kj::PromiseFulfiller<void>>> live;
    for (auto& w : waiters) {
      if (w->isWaiting()) live.add(kj::mv(w));
    }
    waiters = kj::mv(live);
    auto paf = kj::newPromiseAndFulfiller<void>();
    waiters.add(kj::mv(paf.fulfiller));
    return kj::mv(paf.promise);
  }

  // Wakes everyone waiting now.
  void notify() {
    auto woken = kj::mv(waiters);
    for (auto& w : woken) w->fulfill();
  }

private:
  kj::Vector<kj::Own<kj::PromiseFulfiller<void>>> waiters;
};

}  // namespace troupe
