#!/usr/bin/env bash
# Installs what is missing, builds troupe (warnings are errors) and runs the whole test suite.
#
#   scripts/test.sh                      RelWithDebInfo build in build/
#   TROUPE_SANITIZE=1 scripts/test.sh    AddressSanitizer + UndefinedBehaviorSanitizer build in
#                                        build-sanitize/, with clang; the fuzz targets are built
#                                        in it too (BUILD_DIR=build-sanitize scripts/fuzz.sh runs
#                                        them without building again)
# BUILD_DIR overrides the build folder; TROUPE_BUILD_ONLY=1 stops after the build (CI builds the
# sanitizer tree this way in the background, then runs this script again for the suite).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh

flags=(-DCMAKE_BUILD_TYPE=RelWithDebInfo -DTROUPE_WERROR=ON)
if [ "${TROUPE_SANITIZE:-0}" = 1 ]; then
  dir=${BUILD_DIR:-build-sanitize}
  # clang, which compiles the instrumented code in two thirds of GCC's time and can build the
  # fuzz targets (TROUPE_FUZZ: everything carries libFuzzer's coverage hooks too), so that one
  # build serves the suite under the sanitizers and the fuzzing. -O1, as the sanitizers' own
  # documentation advises: their checks are the same, and it compiles in about half the time
  # of -O2. The benchmarks and the Python module are never run under the sanitizers.
  export CC=clang CXX=clang++
  flags+=(-DTROUPE_SANITIZE=ON -DTROUPE_FUZZ=ON -DTROUPE_BUILD_TESTS=ON -DTROUPE_BUILD_EXAMPLES=ON
          -DTROUPE_BUILD_BENCH=OFF -DTROUPE_BUILD_PYTHON=OFF
          "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g -DNDEBUG")
  export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
  export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
else
  dir=${BUILD_DIR:-build}
fi

cmake -S . -B "$dir" -G Ninja "${flags[@]}"
cmake --build "$dir" -j "$(nproc)"
[ "${TROUPE_BUILD_ONLY:-0}" = 1 ] && exit 0
ctest --test-dir "$dir" --output-on-failure -j "$(nproc)"
