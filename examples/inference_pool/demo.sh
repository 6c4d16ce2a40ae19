#!/usr/bin/env bash
# The inference pool demo, end to end, with its results checked (CI runs it as a smoke test):
#   1. a registry (troupe-registry) on a free port;
#   2. inference_demo against it: a job "infer" of 3 replicas started by its own launcher,
#      2000 requests through a pool, one replica killed with SIGKILL halfway, every answer
#      checked against the model;
#   3. SIGTERM to the registry.
# Every process started here is stopped by its own pid, also when the script fails; the
# replicas' logs go to a temporary directory removed at the end.
#
#   demo.sh BIN_DIR
set -euo pipefail
bin=$1
source "$(dirname "$0")/../demo_lib.sh"
demo_init

echo "== starting a registry"
start_registry

echo "== bad arguments give a usage message and status 2"
expect_usage "$bin/inference_demo" --replicas 3

echo "== inference_demo: 3 replicas, 2000 requests, 16 in flight, one replica killed"
run_demo inference_demo env TMPDIR="$out" "$bin/inference_demo" --resolver "$registry" \
  --replicas 3 --requests 2000 --concurrency 16
grep -q '^3 of 3 replicas ready: infer/model-0 infer/model-1 infer/model-2$' "$out/demo.log"
grep -q '^killed infer/model-[012] (pid [0-9]*) with SIGKILL after 1000 responses' "$out/demo.log"
grep -q '^requests: 2000 ok, 0 failed, 0 mismatched$' "$out/demo.log"
grep -q '^throughput: [0-9]* req/s' "$out/demo.log"
grep -q '^latency us: p50 [0-9]* p90 [0-9]* p99 [0-9]*' "$out/demo.log"
# Every request is counted once, by the replica process that answered it.
served=$(awk '/^served by infer\/model-[012] pid [0-9]+: [0-9]+$/ { n += $NF } END { print n + 0 }' \
         "$out/demo.log")
[ "$served" -eq 2000 ] || { echo "replicas served $served requests, not 2000"; exit 1; }
grep -q '^inference demo passed: 2000 requests, 0 failed, failover after killing infer/model-[012]$' \
  "$out/demo.log"
grep -q '^job infer stopped$' "$out/demo.log"

echo "== stopping the registry with SIGTERM"
stop_registry
echo "inference pool demo passed"
