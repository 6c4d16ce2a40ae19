@0xeb95cf8b722a221b;
# The parameter-server example's actor interface: one shard of a model's weights.

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("ps");

interface ParameterServer {
  # The shard's slice of the weights, [begin, end) of a vector of `dim` floats, and its version:
  # how many updates it has applied.
  pull @0 () -> (weights :List(Float32), version :UInt64, begin :UInt32, end :UInt32, dim :UInt32);

  # Applies `weights -= learningRate * gradient` to the slice (the gradient has end - begin
  # entries), off the shard's event loop. `baseVersion` is the version of the weights the
  # gradient was computed from; the shard counts how stale it was. Returns the new version.
  push @1 (gradient :List(Float32), learningRate :Float32, baseVersion :UInt64)
       -> (version :UInt64);

  # What the shard has done so far.
  stats @2 () -> (begin :UInt32, end :UInt32, version :UInt64, pushes :UInt64, pulls :UInt64,
                  maxStaleness :UInt64);
}
