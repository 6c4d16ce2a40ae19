@0x89efaa293b02ad29;
# The inference pool example's actor interface.

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("inference");

interface InferenceServer {
  # Runs the model on `input` (MODEL_INPUTS values). `replica` names the process that answered:
  # "<job>/<actor>-<index> pid <pid>", so that a restarted replica counts apart.
  infer @0 (input :List(Float32)) -> (output :List(Float32), replica :Text);

  # How many infer calls this process has answered.
  stats @1 () -> (served :UInt64);
}
