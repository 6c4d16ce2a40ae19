#!/usr/bin/env bash
# Installs the Debian packages troupe needs to build and test, skipping those already there.
# Runs apt-get directly as root, through sudo otherwise.
#
#   scripts/setup.sh [PACKAGE...]     also the packages named (what a script needs besides)
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config file
  capnproto libcapnp-dev libuv1-dev libspdlog-dev libssl-dev openssl
  libgtest-dev libgmock-dev libbenchmark-dev
  # scripts/fuzz.sh: clang with its sanitizer and libFuzzer runtimes (which clang only
  # recommends, and recommendations are not installed), and llvm-symbolizer for the reports.
  clang libfuzzer-14-dev libclang-rt-14-dev llvm
  # The etcd tests (tests/support/etcd_cluster.h) start real etcd members.
  etcd-server
  # The Slurm tests run on a one-node cluster of real daemons (scripts/slurm-local.sh).
  munge slurm-wlm
  "$@"
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

if [ "$(id -u)" -eq 0 ]; then
  as_root=()
else
  as_root=(sudo)
fi
echo "setup: installing ${missing[*]}" >&2
"${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -q
"${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
  "${missing[@]}"
