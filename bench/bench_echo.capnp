@0xfa056e9d120438ce;
# The echo interface every benchmark server hosts (troupe and plain Cap'n Proto alike).

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("troupe::bench");

interface BenchEcho {
  echo @0 (payload :Data) -> (payload :Data);
  # Takes the payload and answers with its size: a large argument's one-way cost.
  take @1 (payload :Data) -> (size :UInt64);
}
