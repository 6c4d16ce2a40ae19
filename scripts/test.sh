#!/usr/bin/env bash
# Installs what is missing, builds troupe (warnings are errors) and runs the whole test suite.
#
#   scripts/test.sh                      RelWithDebInfo build in build/
#   TROUPE_SANITIZE=1 scripts/test.sh    AddressSanitizer + UndefinedBehaviorSanitizer build in
#                                        build-sanitize/
# BUILD_DIR overrides the build folder.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh

flags=(-DCMAKE_BUILD_TYPE=RelWithDebInfo -DTROUPE_WERROR=ON)
if [ "${TROUPE_SANITIZE:-0}" = 1 ]; then
  dir=${BUILD_DIR:-build-sanitize}
  # -O1, as the sanitizers' own documentation advises: their checks are the same, and the
  # instrumented code compiles in about half the time it takes at -O2.
  flags+=(-DTROUPE_SANITIZE=ON -DTROUPE_BUILD_BENCH=OFF -DTROUPE_BUILD_PYTHON=OFF
          "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g -DNDEBUG")
  export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
  export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
else
  dir=${BUILD_DIR:-build}
fi

cmake -S . -B "$dir" -G Ninja "${flags[@]}"
cmake --build "$dir" -j "$(nproc)"
ctest --test-dir "$dir" --output-on-failure -j "$(nproc)"
