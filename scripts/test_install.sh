#!/usr/bin/env bash
# Checks each way a project consumes troupe by building examples/calculator with it and running
# the calculator's demo:
#   1. `cmake --install` into a prefix; every installed header compiles on its own; then
#      find_package(troupe) from a project of its own, and a one-file program built with
#      `pkg-config --cflags --libs troupe`;
#   2. add_subdirectory(troupe) in a user's project (tests/install/subdirectory: shared
#      libraries; troupe's tests, benchmarks, examples and tools off);
#   3. with --deb: `cpack -G DEB`, then, on a fresh Debian 12 made with debootstrap (minbase,
#      in a scratch folder, entered with chroot): `apt-get install` of the package with just a
#      compiler, CMake and Ninja beside it, and find_package(troupe) from /usr. Needs root (sudo
#      otherwise) and Debian's package mirror ($TROUPE_DEBIAN_MIRROR, default
#      http://deb.debian.org/debian).
#
#   scripts/test_install.sh [--deb]     uses the build in $BUILD_DIR (default build/), which
#                                       scripts/test.sh makes
#   scripts/test_install.sh --prepare DIR
#                                       only makes the fresh Debian 12 of step 3 in DIR (new),
#                                       with the compiler, CMake and Ninja installed, so that a
#                                       later `TROUPE_FRESH_DEBIAN=DIR scripts/test_install.sh
#                                       --deb` uses it (and removes it) instead of making one:
#                                       CI makes it while it builds, as it mostly waits on the
#                                       network
set -euo pipefail
cd "$(dirname "$0")/.."
src=$PWD
build=$(realpath "${BUILD_DIR:-build}")
deb=0
prepare=0
[ "${1:-}" = --deb ] && deb=1
if [ "${1:-}" = --prepare ]; then
  [ $# -eq 2 ] || { echo "usage: scripts/test_install.sh --prepare DIR" >&2; exit 2; }
  prepare=1
fi

scratch=$(mktemp -d)
as_root=()
[ "$(id -u)" -eq 0 ] || as_root=(sudo)
if [ "$prepare" = 1 ]; then
  fresh=$2
else
  fresh=${TROUPE_FRESH_DEBIAN:-$scratch/fresh}
fi
cleanup() {
  # The fresh system's /proc is the host's: unmount it before anything is removed.
  if mountpoint -q "$fresh/proc" 2>/dev/null; then "${as_root[@]}" umount "$fresh/proc"; fi
  if mountpoint -q "$fresh/proc" 2>/dev/null; then
    echo "test_install: $fresh/proc is still mounted; leaving $scratch and $fresh in place" >&2
    return
  fi
  "${as_root[@]}" rm -rf "$scratch"
  # A prepared system is used once.
  if [ "$prepare" = 0 ] && [ -n "${TROUPE_FRESH_DEBIAN:-}" ]; then "${as_root[@]}" rm -rf "$fresh"; fi
}
trap cleanup EXIT

# Configures, builds or runs quietly; shows the output only when that fails.
quietly() { "$@" > "$scratch/step.log" 2>&1 || { cat "$scratch/step.log"; return 1; }; }
configure() { quietly cmake -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@"; }
build() { quietly cmake --build "$1"; }

in_fresh() { "${as_root[@]}" chroot "$fresh" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin \
               HOME=/root DEBIAN_FRONTEND=noninteractive "$@"; }
# A fresh Debian 12 (debootstrap, minbase, entered with chroot) in $fresh with a compiler, CMake
# and Ninja; its /proc is mounted while this runs, unmounted after.
make_fresh() {
  scripts/setup.sh debootstrap
  local mirror=${TROUPE_DEBIAN_MIRROR:-http://deb.debian.org/debian}
  quietly "${as_root[@]}" debootstrap --variant=minbase bookworm "$fresh" "$mirror"
  "${as_root[@]}" mount --bind /proc "$fresh/proc"
  quietly in_fresh apt-get update -q
  quietly in_fresh apt-get install -y -q --no-install-recommends g++ cmake ninja-build
  "${as_root[@]}" umount "$fresh/proc"
}
if [ "$prepare" = 1 ]; then
  [ ! -e "$fresh" ] || { echo "test_install: $fresh exists already" >&2; exit 2; }
  make_fresh
  echo "a fresh Debian 12 with g++, CMake and Ninja is in $fresh"
  exit 0
fi

echo "== 1. cmake --install, its headers alone, find_package(troupe) and pkg-config"
prefix=$scratch/prefix
cmake --install "$build" --prefix "$prefix" > /dev/null
# Every header a user may include compiles by itself (STYLE.md: headers are self-contained).
flags=$(PKG_CONFIG_PATH=$prefix/lib/pkgconfig pkg-config --cflags troupe)
(cd "$prefix/include" && find troupe -name '*.h' | sort) > "$scratch/headers"
# shellcheck disable=SC2016
xargs -P "$(nproc)" -I{} sh -c \
  'printf "#include <%s>\n" "$1" | g++ -std=c++20 -fsyntax-only $2 -x c++ - ||
   { echo "header $1 does not compile on its own" >&2; exit 255; }' _ {} "$flags" \
  < "$scratch/headers"
echo "$(wc -l < "$scratch/headers") installed headers compile on their own"
configure -S examples/calculator -B "$scratch/calc-installed" -DCMAKE_PREFIX_PATH="$prefix"
build "$scratch/calc-installed"
quietly env TROUPE_REGISTRY="$prefix/bin/troupe-registry" examples/calculator/demo.sh \
  "$scratch/calc-installed"
cat > "$scratch/version.cpp" <<'CPP'
#include <stdio.h>
#include <troupe/base/event_loop.h>
#include <troupe/version.h>
int main() { troupe::EventLoop loop; printf("troupe %s\n", troupe::VERSION); }
CPP
# shellcheck disable=SC2046
g++ -std=c++20 "$scratch/version.cpp" -o "$scratch/version" \
  $(PKG_CONFIG_PATH=$prefix/lib/pkgconfig pkg-config --cflags --libs troupe)
"$scratch/version" | grep -qx "troupe $(sed -n 's/^project(troupe VERSION \([0-9.]*\).*/\1/p' CMakeLists.txt)"

# The Python module, when built: where Debian's python3 looks under such a prefix, and working.
if [ -f "$build/python/troupe/__init__.py" ]; then
  site=$(cd "$prefix" && echo lib/python3.*/dist-packages)
  /usr/bin/python3 -c 'import site, sys
sys.exit(0 if "/usr/local/" + sys.argv[1] in site.getsitepackages() else
         "test_install: " + sys.argv[1] + " is not where python3 looks")' "$site"
  PYTHONPATH=$prefix/$site /usr/bin/python3 -c 'import troupe
assert troupe.ResourceConfig.with_gpu("H100", 8).chip_count == 8' ||
    { echo "test_install: the installed Python module does not work" >&2; exit 1; }
  echo "the Python module installs into $site and imports"
fi

echo "== 2. add_subdirectory(troupe), shared libraries"
# Built with no build type (no optimization, no debug information): what this checks is that the
# project builds and runs this way, and a build of everything at -O2 -g again would take minutes.
quietly cmake -G Ninja -S tests/install/subdirectory -B "$scratch/calc-subdirectory" \
  -DTROUPE_SOURCE_DIR="$src"
build "$scratch/calc-subdirectory"
# The project builds no tools: the demo's registry is the one from $build.
quietly env TROUPE_REGISTRY="$build/bin/troupe-registry" \
  examples/calculator/demo.sh "$scratch/calc-subdirectory/calculator"

if [ "$deb" = 1 ]; then
  echo "== 3. cpack -G DEB; apt-get install on a fresh Debian 12, find_package(troupe) from /usr"
  (cd "$scratch" && quietly cpack -G DEB --config "$build/CPackConfig.cmake")
  package=$(ls "$scratch"/troupe_*.deb)
  echo "$(basename "$package"): Depends: $(dpkg-deb --field "$package" Depends)"
  if [ -n "${TROUPE_FRESH_DEBIAN:-}" ]; then
    [ -x "$fresh/usr/bin/g++" ] || { echo "test_install: $fresh is no prepared Debian" >&2; exit 1; }
  else
    make_fresh
  fi
  "${as_root[@]}" mount --bind /proc "$fresh/proc"
  "${as_root[@]}" mkdir -p "$fresh/src/examples"
  "${as_root[@]}" cp -r examples/calculator examples/demo_lib.sh "$fresh/src/examples/"
  "${as_root[@]}" cp "$package" "$fresh/tmp/"
  quietly in_fresh apt-get update -q
  quietly in_fresh apt-get install -y -q --no-install-recommends \
    "/tmp/$(basename "$package")" g++ cmake ninja-build
  quietly in_fresh cmake -S /src/examples/calculator -B /build -G Ninja
  quietly in_fresh cmake --build /build
  quietly in_fresh env TROUPE_REGISTRY=/usr/bin/troupe-registry \
    /src/examples/calculator/demo.sh /build
  if dpkg-deb --contents "$package" | grep -q '/dist-packages/troupe/__init__.py'; then
    # Debian's python3 finds the module from the package, with no PYTHONPATH.
    quietly in_fresh python3 -c 'import troupe; troupe.ResourceConfig.with_cpu(1)'
    echo "python3 imports troupe from the package"
  fi
  echo "the package installs on a fresh Debian 12 and the calculator builds and runs against it"
fi
echo "install checks passed"
