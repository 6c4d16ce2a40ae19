@0xf2a0007765674196;
# Interfaces the test suite hosts.

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("troupe::test");

interface Calculator {
  add @0 (a :Int64, b :Int64) -> (sum :Int64);           # raises when the sum overflows
  divide @1 (a :Int64, b :Int64) -> (quotient :Int64);  # raises on b == 0 and on overflow
}

interface ScientificCalculator extends(Calculator) {
  sqrt @0 (x :Float64) -> (root :Float64);
}

interface Echo {
  echo @0 (payload :Data) -> (payload :Data);
  whoami @1 () -> (pid :UInt32, incarnation :UInt64);
}

interface Blocker {
  # Calls to hold() stay in progress until released (or cancelled).
  hold @0 (tag :Text, replyBytes :UInt64) -> (tag :Text, payload :Data);
  # The reply carries `replyBytes` bytes of payload, byte i being i % 251.
  release @1 (tag :Text) -> (released :Bool);       # false when no call holds that tag
  waitStarted @2 (count :UInt32) -> ();             # once `count` holds started in total
  waitCancelled @3 (count :UInt32) -> ();           # once `count` holds were cancelled in total
  stats @4 () -> (started :UInt32, finished :UInt32, cancelled :UInt32, maxConcurrent :UInt32);
}

interface Member {
  # One replica of a group, telling which it is.
  whoami @0 () -> (name :Text);
  raise @1 (message :Text) -> ();        # always fails with `message`
  calls @2 () -> (count :UInt64);        # calls to whoami, raise and throw so far
  throw @3 (description :Text, type :UInt8) -> ();
  # Fails with exactly this kj::Exception (type: 0 FAILED, 1 OVERLOADED, 2 DISCONNECTED,
  # 3 UNIMPLEMENTED).
  self @4 () -> (member :Member);
  # This member, for calls pipelined on the result; answers at the next call of `calls`.
}
