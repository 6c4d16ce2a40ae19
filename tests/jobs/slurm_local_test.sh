#!/usr/bin/env bash
# The one-node Slurm cluster of scripts/slurm-local.sh (started for this ctest run, SLURM_CONF
# names it) runs what the Slurm launcher will submit: a job of two tasks, each with its own
# SLURM_PROCID and output file; refuses at once a request larger than the node; keeps a
# second job PENDING while the first holds the node; and cancels on scancel.
set -euo pipefail
[ -n "${SLURM_CONF:-}" ] || { echo "FAILED: SLURM_CONF is not set" >&2; exit 1; }
out=$(mktemp -d)
jobs=()
cleanup() {
  for job in "${jobs[@]}"; do scancel "$job" 2>/dev/null || true; done
  rm -rf "$out"
}
trap cleanup EXIT
fail() { echo "FAILED: $*" >&2; exit 1; }

state_of() { scontrol -o show job "$1" | sed -n 's/.* JobState=\([A-Z_]*\) .*/\1/p'; }

# Waits until job $1 is in state $2 (30 s at most, read every 0.1 s: Slurm pushes nothing).
await_state() {
  local i state
  for ((i = 0; i < 300; i++)); do
    state=$(state_of "$1")
    [ "$state" = "$2" ] && return 0
    case $state in COMPLETED | FAILED | CANCELLED | TIMEOUT | NODE_FAIL | OUT_OF_MEMORY)
      fail "job $1 is $state, not $2"
    esac
    sleep 0.1
  done
  fail "job $1 is ${state:-unknown}, still not $2 after 30 s"
}

cpus=$(sinfo --noheader --format=%c | head -n 1)
echo "== a job of two tasks, one output file each"
job=$(sbatch --parsable --job-name=troupe-smoke --ntasks=2 --cpus-per-task=1 --mem-per-cpu=64M \
  --output="$out/batch.txt" \
  --wrap "srun --output=$out/task-%t.txt sh -c 'echo task \$SLURM_PROCID of \$SLURM_NTASKS'")
jobs+=("$job")
await_state "$job" COMPLETED
[ "$(cat "$out/task-0.txt")" = "task 0 of 2" ] || fail "task 0 wrote: $(cat "$out/task-0.txt")"
[ "$(cat "$out/task-1.txt")" = "task 1 of 2" ] || fail "task 1 wrote: $(cat "$out/task-1.txt")"

echo "== a request larger than the node is refused at once"
status=0
output=$(sbatch --test-only --ntasks=$((cpus * 4)) --wrap true 2>&1) || status=$?
[ "$status" -ne 0 ] || fail "sbatch --test-only accepted $((cpus * 4)) tasks on $cpus CPUs"
grep -q "Requested node configuration is not available" <<< "$output" || fail "$output"

echo "== a second job waits while the first holds every CPU, and runs once it is cancelled"
first=$(sbatch --parsable --ntasks="$cpus" --cpus-per-task=1 --mem-per-cpu=64M \
  --output=/dev/null --wrap "sleep 600")
jobs+=("$first")
await_state "$first" RUNNING
second=$(sbatch --parsable --ntasks=1 --cpus-per-task=1 --mem-per-cpu=64M --output=/dev/null \
  --wrap "true")
jobs+=("$second")
[ "$(state_of "$second")" = PENDING ] || fail "job $second is $(state_of "$second"), not PENDING"
scancel "$first"
await_state "$first" CANCELLED
await_state "$second" COMPLETED
echo "ok"
