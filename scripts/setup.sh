#!/usr/bin/env bash
# Installs the Debian packages troupe needs to build and test, skipping those already there.
# Runs apt-get directly as root, through sudo otherwise.
#
#   scripts/setup.sh [PACKAGE...]     also the packages named (what a script needs besides)
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config file
  capnproto libcapnp-dev libuv1-dev libspdlog-dev libssl-dev openssl
  # Blob chunks carry XXH3 checksums (header only: xxhash is compiled into troupe).
  libxxhash-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  # scripts/fuzz.sh: clang with its sanitizer and libFuzzer runtimes (which clang only
  # recommends, and recommendations are not installed), and llvm-symbolizer for the reports.
  clang libfuzzer-14-dev libclang-rt-14-dev llvm
  # scripts/format.sh: the layout of the code (.clang-format), checked in CI.
  clang-format
  # The etcd tests (tests/support/etcd_cluster.h) start real etcd members.
  etcd-server
  # The Slurm tests run on a one-node cluster of real daemons (scripts/slurm-local.sh).
  munge slurm-wlm
  # The dashboard's test drives a real headless browser (tests/dashboard/dashboard_test.py).
  chromium chromium-driver python3 python3-selenium
  python3-dev pybind11-dev python3-pytest
  # The Python module's troupe.Tensor is a NumPy array (or a torch tensor); its tests send
  # both, and examples/rl_weight_sync trains a policy with torch (CPU).
  python3-numpy python3-torch
  # The module's type stubs are checked with mypy (tests/python/test_typing.py).
  mypy
  "$@"
)

root=$(cd "$(dirname "$0")/.." && pwd)

# promtool, Prometheus' own checker of the metrics format (the metrics tests run it), comes out
# of Debian's prometheus package unpacked under .cache/, not installed: installing the package
# would also start and enable a Prometheus server listening on every interface.
fetch_promtool() {
  local dir="$root/.cache/prometheus"
  [ -x "$dir/usr/bin/promtool" ] && return 0
  mkdir -p "$root/.cache/debs"
  if ! (cd "$root/.cache/debs" && apt-get download -q prometheus 2>/dev/null); then
    "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -q
    (cd "$root/.cache/debs" && apt-get download -q prometheus)
  fi
  rm -rf "$dir"
  dpkg-deb -x "$root"/.cache/debs/prometheus_*.deb "$dir"
  rm -f "$root"/.cache/debs/prometheus_*.deb
}

if [ "$(id -u)" -eq 0 ]; then
  as_root=()
else
  as_root=(sudo)
fi

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}" >&2
  "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -q
  "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
    "${missing[@]}"
fi
fetch_promtool
