#!/usr/bin/env bash
# The coordinator/worker demo, end to end, with its results checked (CI runs it as a smoke test):
#   1. a registry (troupe-registry) on a free port;
#   2. coord_demo against it: a coordinator job and a job of 4 workers started by a
#      LocalLauncher; one worker is killed and another stalled while they hold tasks, and every
#      one of the 200 tasks must still be done exactly once;
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

echo "== bad arguments: usage, status 2"
expect_usage "$bin/coord_demo" --tasks 10
status=0
"$bin/coord_demo" --resolver bad://x --log-dir "$out/bad" 2> "$out/usage.err" || status=$?
[ "$status" -eq 2 ] || { echo "coord_demo with a bad resolver URL exited with $status"; exit 1; }
grep -q "unknown resolver URL 'bad://x'" "$out/usage.err"

# Fails unless the demo's output has a line matching $1.
expect() {
  grep -q -- "$1" "$out/demo.log" || { echo "missing from coord_demo's output: $1"; exit 1; }
}

echo "== coord_demo: 200 tasks, 4 workers, one killed, one stalled"
run_demo coord_demo "$bin/coord_demo" --resolver "$registry" --tasks 200 --workers 4 \
  --log-dir "$out/logs"
expect '^coordinator ready: 200 tasks, leases of 500 ms$'
expect '^killed workers-[0-9]*\.[0-9]* (pid [0-9]*) with SIGKILL while it held lease [0-9]* on task'
expect '^the launcher saw it exit; reported gone, [1-9][0-9]* lease(s) reclaimed at once$'
expect '^stalled workers-.* the lease expired [0-9]* ms later and the task was queued again$'
expect '^workers-.* resumed with SIGCONT; its late result for task [0-9]* was refused$'
expect '^all 200 tasks done$'
expect ' (killed)$'
expect " (the killed one's replacement)$"
expect ' (stalled, then resumed)$'
expect '^leases reclaimed: [0-9]* ([1-9][0-9]* from the killed worker, [1-9][0-9]* expired on the stalled one); late results refused: [1-9]'
expect '^complete() repeated under its lease: acknowledged, counted once; under the killed'
expect '^workers job succeeded: 5 worker processes (1 restarted)$'
expect '^coordinator demo passed: 200 tasks, each done exactly once ([1-9][0-9]* reclaimed from the killed worker)$'
if grep -q 'MISMATCH' "$out/demo.log"; then echo "coord_demo reported a mismatch"; exit 1; fi
# The worker replicas' own reports: each of the 4 left once no task was left.
left=$(cat "$out"/logs/workers/replica-*.log | grep -c 'no task left$' || true)
[ "$left" -eq 4 ] || { echo "$left workers reported leaving, expected 4"; exit 1; }

echo "== stopping the registry"
stop_registry
echo "coordinator/worker demo passed"
