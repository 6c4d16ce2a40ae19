#!/usr/bin/env bash
# Installs what is missing, builds troupe's demo and runs it: a registry, a job of three
# replicas hosting a Calculator actor, a pool calling them round-robin and broadcasting to them,
# a direct call to one, then a graceful stop of everything.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo > /dev/null
cmake --build build --target troupe-registry calculator_server calculator_client calculator_pool
examples/calculator/demo.sh build/bin
