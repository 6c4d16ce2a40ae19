#!/usr/bin/env bash
# Builds the libFuzzer targets (fuzz/README.md) with clang, AddressSanitizer and
# UndefinedBehaviorSanitizer in build-fuzz/, runs each for SECONDS on a copy of its seed corpus
# (fuzz/corpus/<target>, which stays as it is), and prints how many inputs each ran.
#
#   scripts/fuzz.sh SECONDS               every target, SECONDS each
#   scripts/fuzz.sh SECONDS TARGET...     only these (actor_server, parse, ...)
#
# Exits non-zero when a target crashed, tripped a sanitizer, hung or leaked (its input is kept
# in the temporary folder named at the end), or when all targets together ran fewer than
# TROUPE_FUZZ_MIN_EXECS inputs (default 0). A round short of that minimum (a machine busy with
# other work) is followed by another of SECONDS per target, on the corpora grown so far, up to
# TROUPE_FUZZ_MAX_ROUNDS rounds (default 3). Targets run side by side, as many at once as there
# are cores (FUZZ_JOBS overrides). BUILD_DIR overrides the build folder.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ $# -lt 1 ] || ! [[ $1 =~ ^[0-9]+$ ]] || [ "$1" -eq 0 ]; then
  echo "usage: scripts/fuzz.sh SECONDS [TARGET...]" >&2
  exit 2
fi
seconds=$1
shift
min_execs=${TROUPE_FUZZ_MIN_EXECS:-0}
max_rounds=${TROUPE_FUZZ_MAX_ROUNDS:-3}
jobs=${FUZZ_JOBS:-$(nproc)}
dir=${BUILD_DIR:-build-fuzz}

scripts/setup.sh
built=$SECONDS
CC=clang CXX=clang++ cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DTROUPE_FUZZ=ON -DTROUPE_WERROR=ON
cmake --build "$dir" --target troupe_fuzz -j "$(nproc)"
echo "fuzz: built in $((SECONDS - built))s"

if [ $# -gt 0 ]; then
  targets=("$@")
else
  targets=()
  for corpus in fuzz/corpus/*/; do targets+=("$(basename "$corpus")"); done
fi
for t in "${targets[@]}"; do
  if [ ! -x "$dir/bin/${t}_fuzz" ] || [ ! -d "fuzz/corpus/$t" ]; then
    echo "fuzz: no target '$t' (expected $dir/bin/${t}_fuzz and fuzz/corpus/$t)" >&2
    exit 2
  fi
done

work=$(mktemp -d "${TMPDIR:-/tmp}/troupe-fuzz.XXXXXX")
running=()
stop() {
  for pid in "${running[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${running[@]}"; do wait "$pid" 2>/dev/null || true; done
}
trap stop EXIT
trap 'exit 130' INT TERM

export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}

# One target: its corpus copied into its own folder, where libFuzzer also writes what it finds
# (crash-*, leak-*, timeout-*, oom-*). A per-input timeout well above the targets' own limits
# (fuzz/raw_peer.h) catches hangs anywhere else.
start() {
  local t=$1
  if [ ! -d "$work/$t/corpus" ]; then
    mkdir -p "$work/$t"
    cp -r "fuzz/corpus/$t" "$work/$t/corpus"
  fi
  "$dir/bin/${t}_fuzz" -max_total_time="$seconds" -print_final_stats=1 -timeout=30 \
    -artifact_prefix="$work/$t/" "$work/$t/corpus" >"$work/$t/log" 2>&1 &
  running+=($!)
}

status=0
total=0
crashes=0
report() {
  local t=$1 rc=$2
  local execs
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$work/$t/log" | tail -1)
  execs=${execs:-0}
  local found=()
  for a in "$work/$t"/crash-* "$work/$t"/leak-* "$work/$t"/timeout-* "$work/$t"/oom-*; do
    [ -e "$a" ] && found+=("$a")
  done
  if [ "$rc" -ne 0 ] && [ ${#found[@]} -eq 0 ]; then
    found+=("(none saved; exit status $rc)")
  fi
  echo "fuzz: $t: $execs executions in ${seconds}s, ${#found[@]} crashes"
  total=$((total + execs))
  if [ ${#found[@]} -gt 0 ]; then
    crashes=$((crashes + ${#found[@]}))
    tail -n 40 "$work/$t/log" | sed "s/^/fuzz: $t: /"
    for a in "${found[@]}"; do echo "fuzz: $t: input $a"; done
    echo "fuzz: $t: log $work/$t/log"
  fi
}

ran=$SECONDS
round=0
while :; do
  round=$((round + 1))
  queue=("${targets[@]}")
  while [ ${#queue[@]} -gt 0 ]; do
    batch=("${queue[@]:0:$jobs}")
    queue=("${queue[@]:$jobs}")
    running=()
    for t in "${batch[@]}"; do start "$t"; done
    pids=("${running[@]}")
    for i in "${!batch[@]}"; do
      rc=0
      wait "${pids[$i]}" || rc=$?
      report "${batch[$i]}" "$rc"
    done
    running=()
  done
  if [ "$crashes" -gt 0 ] || [ "$total" -ge "$min_execs" ] || [ "$round" -ge "$max_rounds" ]; then
    break
  fi
  echo "fuzz: round $round ran $total executions, short of $min_execs; another round"
done

echo "fuzz: ran in $((SECONDS - ran))s"
echo "fuzz: total $total executions in ${#targets[@]} targets, $crashes crashes"
if [ "$crashes" -gt 0 ]; then
  echo "fuzz: what the targets found is in $work"
  status=1
else
  rm -rf "$work"
fi
if [ "$total" -lt "$min_execs" ]; then
  echo "fuzz: fewer executions than TROUPE_FUZZ_MIN_EXECS=$min_execs" >&2
  status=1
fi
exit $status
