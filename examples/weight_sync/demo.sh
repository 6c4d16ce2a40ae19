#!/usr/bin/env bash
# The weight-sync demo, end to end, with its results checked (CI runs it as a smoke test):
#   1. a registry (troupe-registry) on a free port, TLS and a cluster token for everything;
#   2. weight_sync_demo against it: a job "infer" of 4 replicas, 4 versions of 32 MiB of
#      weights broadcast down a chain while 8 requests at a time keep going to the pool, every
#      answer checked against the version that gave it;
#   3. SIGTERM to the registry.
# Every process started here is stopped by its own pid, also when the script fails.
#
#   demo.sh BIN_DIR
set -euo pipefail
bin=$1
source "$(dirname "$0")/../demo_lib.sh"
demo_init

echo "== starting a registry"
start_registry

echo "== bad arguments give a usage message and status 2"
expect_usage "$bin/weight_sync_demo" --replicas 3
expect_usage "$bin/weight_sync_demo" --resolver "$registry" --fanout ring

echo "== weight_sync_demo: 4 replicas, 4 versions of 32 MiB, chain"
run_demo weight_sync_demo env TMPDIR="$out" "$bin/weight_sync_demo" --resolver "$registry" \
  --replicas 4 --steps 4 --mib 32
for v in 1 2 3 4; do
  grep -q "^version $v: 32 MiB to 4 of 4 replicas in [0-9]* ms (chain, " "$out/demo.log"
done
grep -q '^requests: [1-9][0-9]* served, 0 wrong, 0 failed$' "$out/demo.log"
[ "$(grep -c '^infer/model-[0-3] holds version 4 (32 MiB), 4 versions swapped in$' "$out/demo.log")" -eq 4 ]
grep -q '^weight sync demo passed$' "$out/demo.log"

echo "== stopping the registry with SIGTERM"
stop_registry
echo "weight sync demo passed"
