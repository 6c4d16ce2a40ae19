#!/usr/bin/env bash
# Installs what is missing, builds troupe's demo and runs it: a parameter server. A registry, a
# job of shards each hosting one ParameterServer actor (a slice of a model's weights), and a job
# of trainers that pull the weights from every shard, compute gradients and push them back,
# until the loss has gone down; then everything stops gracefully.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
echo "== building the registry and the demo (build/)"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo > /dev/null
cmake --build build --target troupe-registry ps_demo
examples/parameter_server/demo.sh build/bin
