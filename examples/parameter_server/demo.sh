#!/usr/bin/env bash
# The parameter-server demo, end to end, with its results checked (CI runs it as a smoke test):
#   1. a registry (troupe-registry) on a free port (or etcd, or $TROUPE_RESOLVER: demo_lib.sh);
#   2. ps_demo against it: a job of 2 parameter-server shards and a job of 2 trainers, started
#      by an embedded launcher, train a logistic-regression model through troupe RPC (ps_demo
#      itself checks that the loss went down), then the shards are stopped. With
#      DEMO_LAUNCHER=slurm the jobs are Slurm jobs (sbatch must reach a cluster: SLURM_CONF, or
#      scripts/slurm-local.sh for one on this machine) and DEMO_PARTITION names the partition;
#   3. SIGTERM to the registry.
# With DEMO_TRAINER=python the trainers are trainer.py (the troupe Python module on PYTHONPATH).
# Every process started here is stopped by its own pid, also when the script fails.
#
#   demo.sh BIN_DIR
set -euo pipefail
bin=$1
source "$(dirname "$0")/../demo_lib.sh"
demo_init

# Fails the demo, saying which check did not hold.
expect() {
  local what=$1
  shift
  "$@" || { echo "FAILED: expected $what" >&2; exit 1; }
}

echo "== starting a resolver, where the jobs' replicas publish their actors"
start_resolver

shards=2
trainers=2
echo "== ps_demo: $shards shards, $trainers trainers, training through troupe RPC"
status=0
launcher=()
if [ "${DEMO_LAUNCHER:-local}" = slurm ]; then
  launcher=(--launcher slurm --log-dir "$out/slurm-logs")
  [ -n "${DEMO_PARTITION:-}" ] && launcher+=(--partition "$DEMO_PARTITION")
fi
if [ "${DEMO_TRAINER:-cpp}" = python ]; then
  launcher+=(--python-trainer "$(cd "$(dirname "$0")" && pwd)/trainer.py")
fi
TMPDIR=$out "$bin/ps_demo" --resolver "$registry" "${launcher[@]}" --shards "$shards" \
  --trainers "$trainers" --steps 60 --dim 32 | tee "$out/ps_demo.log" || status=$?
[ "$status" -eq 0 ] || { echo "ps_demo exited with $status" >&2; exit 1; }

log=$out/ps_demo.log
expect "the loss to go down" grep -q '^loss went down: ' "$log"
expect "one stats line per shard" \
  [ "$(grep -c '^shard shards/ps-[0-9]* \[[0-9]*, [0-9]*): 120 pushes applied, version 120' "$log")" -eq "$shards" ]
for t in $(seq 0 $((trainers - 1))); do
  expect "trainer $t's loss lines" grep -q "^  \[$t\] trainer $t step 60 loss [0-9.]*$" "$log"
done
if [ "${DEMO_TRAINER:-cpp}" = python ]; then
  expect "the trainers to be Python's" \
    [ "$(grep -c 'shards ready (Python)$' "$log")" -eq "$trainers" ]
fi
expect "the shards job to stop" grep -q '^shards job stopped$' "$log"

echo "== stopping the resolver"
stop_resolver
echo "parameter-server demo passed"
