@0xb58679c3daf185d4;
# The calculator example's actor interface.

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("calculator");

interface Calculator {
  add @0 (a :Float64, b :Float64) -> (value :Float64);
  divide @1 (a :Float64, b :Float64) -> (value :Float64);   # raises on b == 0
  sum @2 (values :List(Float64)) -> (value :Float64);       # computed off the event loop
  calls @3 () -> (count :UInt64);                           # calls served so far
}
