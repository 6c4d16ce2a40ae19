#pragma once
// Helpers for tests whose loop keeps time by hand (EventLoopOptions::manualClock): moving the
// clock the way real time would, and a bound in real time on how long a test waits.

#include <kj/async.h>
#include <kj/time.h>

#include "troupe/base/event_loop.h"

namespace troupe::test {

// Resolves after `delay` of real time, whatever the loop's own clock says: a manual clock never
// moves while a test waits, so this is what bounds a wait that should end but might not. A
// libuv timer on `loop`, stopped when the promise is dropped. Loop thread only.
kj::Promise<void> afterRealTime(EventLoop& loop, kj::Duration delay);

// Moves `loop`'s manual clock forward by `total` in steps of at most `step`, polling the loop
// once before the first step and after each one, so that what a timer sets off (a renewal, a
// retry, a trim) happens before the next step, as it would in real time. Throws if the loop has
// no manual clock. Loop thread only, not from inside a callback.
//
// Its premise: what a step sets off completes within the poll that follows. Each poll runs the
// loop until it is idle (kj's WaitScope::poll: until its queue is empty and libuv reports no
// I/O ready), and a round trip between two ends on this loop completes within that, since each
// write makes the other end readable before the poll looks again: in-process calls, unix
// sockets and (as Linux delivers it at once) loopback TCP. A reply from another process or
// thread does not: it comes when that peer gets to it, perhaps after later steps. Wait for such
// a peer's events instead, and move the clock only while it sends nothing (frozen, say).
void advanceInSteps(EventLoop& loop, kj::Duration total, kj::Duration step);

}  // namespace troupe::test
