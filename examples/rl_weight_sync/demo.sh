#!/usr/bin/env bash
# The RL weight-sync demo, short, with its results checked (CI runs it as a smoke test):
#   1. a registry (troupe-registry) on a free port (or etcd, or $TROUPE_RESOLVER: demo_lib.sh),
#      TLS and a cluster token for everything;
#   2. rl_weight_sync.py against it: 2 rollout actors, 15 REINFORCE steps, each step's weights
#      broadcast down a chain; every step's line, every actor's last version and the rise of
#      the reward checked;
#   3. SIGTERM to the registry.
# Needs torch (Debian's python3-torch) in $PYTHON (default /usr/bin/python3) and the troupe
# module on PYTHONPATH; without torch it says so and exits with 77 (ctest's SKIP_RETURN_CODE).
# Every process started here is stopped by its own pid, also when the script fails.
#
#   demo.sh BIN_DIR
set -euo pipefail
bin=$1
here=$(cd "$(dirname "$0")" && pwd)
python=${PYTHON:-/usr/bin/python3}
if ! "$python" -c 'import torch' 2>/dev/null; then
  echo "rl weight sync demo skipped: $python cannot import torch (apt install python3-torch)"
  exit 77
fi
source "$here/../demo_lib.sh"
demo_init

# Fails the demo, saying which check did not hold.
expect() {
  local what=$1
  shift
  "$@" || { echo "FAILED: expected $what" >&2; exit 1; }
}

actors=2
steps=15
echo "== bad arguments give a usage message and status 2"
expect_usage "$python" "$here/rl_weight_sync.py" --actors 0
expect_usage "$python" "$here/rl_weight_sync.py" --fanout ring

echo "== starting a resolver, where the rollout actors publish"
start_resolver

echo "== rl_weight_sync.py: $actors rollout actors, $steps steps, chain"
run_demo rl_weight_sync.py env TMPDIR="$out" "$python" "$here/rl_weight_sync.py" \
  --resolver "$registry" --actors "$actors" --steps "$steps" --episodes 32
log=$out/demo.log
for s in $(seq 1 "$steps"); do
  played="^step $s: reward [0-9.]* from $actors actors on version $((s - 1)), "
  expect "step $s's line" grep -q "${played}version $s broadcast in [0-9.]* ms (chain)$" "$log"
done
expect "the steps/s line" grep -q '^steps/s: [0-9.]*$' "$log"
expect "every actor to hold version $steps" \
  [ "$(grep -c "^rollout/rollout-[0-9]* holds version $steps$" "$log")" -eq "$actors" ]
expect "the reward to rise" grep -q '^reward rose from [0-9.]* to [0-9.]*$' "$log"
expect "the demo to pass" grep -q '^rl weight sync demo passed$' "$log"

echo "== stopping the resolver"
stop_resolver
echo "rl weight sync demo passed"
