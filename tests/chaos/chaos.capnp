@0xfa3dac37d88f4a00;
# The actor the chaos test (chaos_test.cpp) calls under load while it kills, freezes and
# restarts the processes around it.

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("troupe::chaos");

interface Chaos {
  idempotentOp @0 (callId :UInt64) -> (pid :UInt32);
  # Changes nothing: running it twice is harmless. Answers with the pid of the replica that ran
  # it.

  recordOnce @1 (callId :UInt64) -> (pid :UInt32);
  # Appends `callId` to the ledger of this replica incarnation (ledger.h) before it answers, so
  # that the test can count how many times each call ran, also in replicas it killed.
}
