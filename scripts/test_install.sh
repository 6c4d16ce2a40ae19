#!/usr/bin/env bash
# Checks each way a project consumes troupe by building examples/calculator with it and running
# the calculator's demo:
#   1. `cmake --install` into a prefix, then find_package(troupe) from a project of its own, and
#      a one-file program built with `pkg-config --cflags --libs troupe`;
#   2. add_subdirectory(troupe) in a user's project (tests/install/subdirectory: shared
#      libraries; troupe's tests, benchmarks and examples off);
#   3. with --deb: `cpack -G DEB`, `apt-get install` of the package (as root, through sudo
#      otherwise), then find_package(troupe) from /usr; the package is removed again at the end.
#
#   scripts/test_install.sh [--deb]     uses the build in $BUILD_DIR (default build/), which
#                                       scripts/test.sh makes
set -euo pipefail
cd "$(dirname "$0")/.."
src=$PWD
build=$(realpath "${BUILD_DIR:-build}")
deb=0
[ "${1:-}" = --deb ] && deb=1

scratch=$(mktemp -d)
installed_deb=0
as_root=()
[ "$(id -u)" -eq 0 ] || as_root=(sudo)
cleanup() {
  if [ "$installed_deb" = 1 ]; then
    "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get remove -y -q troupe > /dev/null
  fi
  rm -rf "$scratch"
}
trap cleanup EXIT

# Configures or builds quietly; shows the output only when that fails.
quietly() { "$@" > "$scratch/step.log" 2>&1 || { cat "$scratch/step.log"; return 1; }; }
configure() { quietly cmake -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@"; }
build() { quietly cmake --build "$1"; }

echo "== 1. cmake --install, then find_package(troupe) and pkg-config"
prefix=$scratch/prefix
cmake --install "$build" --prefix "$prefix" > /dev/null
configure -S examples/calculator -B "$scratch/calc-installed" -DCMAKE_PREFIX_PATH="$prefix"
build "$scratch/calc-installed"
quietly env TROUPE_REGISTRY="$prefix/bin/troupe-registry" examples/calculator/demo.sh "$scratch/calc-installed"
cat > "$scratch/version.cpp" <<'CPP'
#include <stdio.h>
#include <troupe/actor/event_loop.h>
#include <troupe/version.h>
int main() { troupe::EventLoop loop; printf("troupe %s\n", troupe::VERSION); }
CPP
flags=$(PKG_CONFIG_PATH=$prefix/lib/pkgconfig pkg-config --cflags --libs troupe)
# shellcheck disable=SC2086
g++ -std=c++20 "$scratch/version.cpp" -o "$scratch/version" $flags
"$scratch/version" | grep -qx "troupe $(sed -n 's/^project(troupe VERSION \([0-9.]*\).*/\1/p' CMakeLists.txt)"

echo "== 2. add_subdirectory(troupe), shared libraries"
configure -S tests/install/subdirectory -B "$scratch/calc-subdirectory" -DTROUPE_SOURCE_DIR="$src"
build "$scratch/calc-subdirectory"
quietly env TROUPE_REGISTRY="$scratch/calc-subdirectory/troupe/tools/troupe-registry" \
  examples/calculator/demo.sh "$scratch/calc-subdirectory/calculator"

if [ "$deb" = 1 ]; then
  echo "== 3. cpack -G DEB, apt-get install, find_package(troupe) from /usr"
  (cd "$scratch" && quietly cpack -G DEB --config "$build/CPackConfig.cmake")
  package=$(ls "$scratch"/troupe_*.deb)
  echo "$(basename "$package"): Depends: $(dpkg-deb --field "$package" Depends)"
  "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$package" > /dev/null
  installed_deb=1
  configure -S examples/calculator -B "$scratch/calc-deb"
  build "$scratch/calc-deb"
  quietly env TROUPE_REGISTRY=/usr/bin/troupe-registry examples/calculator/demo.sh "$scratch/calc-deb"
fi
echo "install checks passed"
