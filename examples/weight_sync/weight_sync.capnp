@0xc2d4e6f8a1b3c5d7;
# The weight-sync example's actor: a model replica that answers requests with whatever version
# of its weights it holds, and takes new versions as blobs named "weights".

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("weightsync");

interface Model {
  infer @0 (input :List(Float32)) -> (output :Float32, version :UInt64);
  # The dot product of `input` with the first input.size() weights, and the version of the
  # weights that computed it. (Version v's weights are all v, so output = v * sum(input).)

  current @1 () -> (version :UInt64, bytes :UInt64, swaps :UInt64);
  # The version held, its size, and how many versions this process has swapped in.
}
