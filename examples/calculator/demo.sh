#!/usr/bin/env bash
# The calculator demo, end to end, with its results checked (CI runs it as a smoke test):
#   1. a registry (troupe-registry) on a free port;
#   2. a job "calc" of 3 replicas (calculator_server), each publishing itself in the registry;
#   3. calculator_pool: waits for the replicas, calls them round-robin through a pool, then
#      broadcasts to all of them;
#   4. calculator_client: calls one replica directly (deadline, calls in flight, offloaded work,
#      an error raised by the actor);
#   5. SIGTERM to each replica (they drain and leave the registry) and to the registry.
# Every process started here is stopped by its own pid, also when the script fails.
#
#   demo.sh BIN_DIR
set -euo pipefail
bin=$1
source "$(dirname "$0")/../demo_lib.sh"
demo_init

echo "== starting a registry"
start_registry

echo "== starting job 'calc': 3 replicas"
replica_pids=()
for i in 0 1 2; do
  TROUPE_RESOLVER=$registry TROUPE_JOB_ID=calc TROUPE_TASK_INDEX=$i TROUPE_NUM_TASKS=3 \
    "$bin/calculator_server" > "$out/replica-$i.log" 2>&1 &
  replica_pids+=($!)
  pids+=($!)
  echo "replica $i: pid $!"
done

echo "== a pool over the job's replicas"
"$bin/calculator_pool" "$registry" calc 3 | tee "$out/pool.log"
grep -q '^3 of 3 replicas ready: calc/calc-0 calc/calc-1 calc/calc-2$' "$out/pool.log"
grep -q '^pool: add(6, 6) = 12$' "$out/pool.log"
[ "$(grep -c '^broadcast: calc/calc-[012] has served 3 calls' "$out/pool.log")" -eq 3 ]
grep -q '^sum(1..1000) across 3 replicas = 500500$' "$out/pool.log"

echo "== one replica, called directly"
address=$(sed -n 's/^calculator serving at \([^ ]*\) .*/\1/p' "$out/replica-0.log")
"$bin/calculator_client" "$address" | tee "$out/client.log"
grep -q '^add(1.5, 2.25) = 3.75$' "$out/client.log"
grep -q '^100 / 1..4 = 100 50 33.3333 25$' "$out/client.log"
grep -q '^sum(1..1000) = 500500$' "$out/client.log"
grep -q 'divide(1, 0) failed as expected: failed (.*cannot divide by zero' "$out/client.log"

echo "== stopping: SIGTERM drains each replica, then the registry"
for pid in "${replica_pids[@]}"; do
  kill -TERM "$pid"
  status=0
  wait "$pid" || status=$?
  [ "$status" -eq 0 ] || { echo "replica $pid exited with $status"; exit 1; }
done
stop_registry
echo "calculator demo passed"
