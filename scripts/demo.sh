#!/usr/bin/env bash
# Installs what is missing, builds troupe's demo and runs it: a replica hosting a Calculator
# actor in one process, a client calling it from another, then a graceful stop.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo > /dev/null
cmake --build build --target calculator_server calculator_client
examples/calculator/smoke_test.sh build/bin
