#!/usr/bin/env bash
# troupe beside raw TCP and plain Cap'n Proto (and gRPC / CAF where they build) in the peer
# harness (/work/shared/peers): the same echo matrix (64 B, 4 KiB, 1 MiB with K = 1 and 32;
# 64 MiB with K = 1 and 4), through troupe::ActorRef ("troupe"), through an ActorPool over a
# one-member group ("troupe_pool"), and through ActorRef with requests that point at the client's
# payload instead of copying it (troupe::adoptBytes, "troupe_adopt"), in two placements, REPS
# times each; then one 256 MiB check per placement; then a median table per placement with
# troupe's ratios (compare_table.py).
#
#   bench/compare.sh                 # ~5 min on an idle 2-vCPU machine, plus builds
#
# Knobs (environment):
#   BUILD=build                troupe build dir, relative to the repo root (configured with
#                              RelWithDebInfo if it has no CMakeCache.txt yet)
#   PEERS_DIR=/work/shared/peers   the harness (run.sh, the peers' sources)
#   WORK=$BUILD/peers          where the peers are built and results/ is written
#   PEERS="raw capnp grpc"     harness peers to run beside troupe; a peer whose packages are
#                              missing is skipped and said so (grpc: libgrpc++-dev,
#                              protobuf-compiler-grpc and libprotobuf-dev, which the other two
#                              do not pull in; caf, caf_sharing: libcaf-dev)
#   REPS=3                     repetitions of each placement (interleaved: same, free, same, ...)
#   PLACEMENTS="same free"     same = client and server on CPU 0 (run.sh PIN=same), split = server
#                              on CPU 0 and client on CPU 1, free = unpinned
#   WAIT_QUIET=30              run.sh waits up to this many seconds for the machine to be < 15 %
#                              busy before each peer
#   HUGE=256M                  the payload of the large-message check ("" skips it), run once per
#                              placement for troupe, troupe_pool, troupe_adopt and raw: 1
#                              warmup call, then
#   HUGE_CHECK_CALLS=3         measured calls
#   SMALL_CALLS, SMALL_WARMUP, MIB_CALLS, MIB_WARMUP, HUGE_CALLS, HUGE_WARMUP, NICE: passed to
#                              run.sh (its defaults: 10000/1000, 300/30, 8/2)
#
# Output: progress on stderr, the tables on stdout (also saved as $WORK/results/compare-*.md).
set -euo pipefail

source "$(dirname "$0")/bench_lib.sh" compare.sh
PEERS=${PEERS:-raw capnp grpc}
REPS=${REPS:-3}
PLACEMENTS=${PLACEMENTS:-same free}
export WAIT_QUIET=${WAIT_QUIET:-30}
HUGE=${HUGE-256M}
HUGE_CHECK_CALLS=${HUGE_CHECK_CALLS:-3}

# ---------------------------------------------------------------- troupe's echo pair
log "building troupe_echo_server troupe_echo_client in $BUILD"
cmake --build "$BUILD" --target troupe_echo_server troupe_echo_client >&2
BIN=$(cd "$BUILD/bin" && pwd)
# run.sh passes every peer the same flags, so the pool and adopt clients are wrappers adding
# --pool and --adopt.
POOL_CLIENT=$(cd "$BUILD" && pwd)/troupe_echo_client_pool.sh
printf '#!/bin/sh\nexec %s/troupe_echo_client --pool "$@"\n' "$BIN" > "$POOL_CLIENT"
ADOPT_CLIENT=$(cd "$BUILD" && pwd)/troupe_echo_client_adopt.sh
printf '#!/bin/sh\nexec %s/troupe_echo_client --adopt "$@"\n' "$BIN" > "$ADOPT_CLIENT"
chmod +x "$POOL_CLIENT" "$ADOPT_CLIENT"

# ---------------------------------------------------------------- the peers
installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }
WITH_GRPC=ON WITH_CAF=ON RUN_PEERS=""
GRPC_PACKAGES="libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev"
for p in $GRPC_PACKAGES; do installed "$p" || WITH_GRPC=OFF; done
if ! installed libcaf-dev; then WITH_CAF=OFF; fi
for p in $PEERS; do
  case $p in
    grpc) [ $WITH_GRPC = ON ] || { log "SKIPPING grpc: one of $GRPC_PACKAGES is not installed"; continue; } ;;
    caf|caf_sharing) [ $WITH_CAF = ON ] || { log "SKIPPING $p: libcaf-dev not installed"; continue; } ;;
  esac
  RUN_PEERS="$RUN_PEERS $p"
done
# run.sh configures $WORK/build with only CMAKE_BUILD_TYPE; options set here stay in the cache.
cmake -S "$PEERS_DIR" -B "$WORK/build" -DCMAKE_BUILD_TYPE=Release \
  -DPEERS_WITH_GRPC=$WITH_GRPC -DPEERS_WITH_CAF=$WITH_CAF > /dev/null
log "building the peers in $WORK/build (log: $WORK/results/build.log)"
built=$(WORK=$WORK PEERS=" " "$PEERS_DIR/run.sh" 2>&1 >/dev/null | tee /dev/stderr |
        sed -n 's/^\[run.sh\] results: //p')
[ -n "$built" ] || { log "building the peers failed"; exit 1; }
rm -f "$WORK/$built"  # that run measured nothing

# ---------------------------------------------------------------- the runs
trap stop_server EXIT INT TERM

pin_args() {  # $1 = placement, $2 = server|client
  case "$1:$2" in
    same:*) echo "taskset -c 0" ;;
    split:server) echo "taskset -c 0" ;;
    split:client) echo "taskset -c 1" ;;
    free:*) echo "" ;;
    *) log "unknown placement $1 (same, split, free)"; exit 2 ;;
  esac
}

bytes() {  # 256M -> 268435456
  case $1 in
    *[Gg]) echo $(( ${1%?} << 30 )) ;;
    *[Mm]) echo $(( ${1%?} << 20 )) ;;
    *[Kk]) echo $(( ${1%?} << 10 )) ;;
    *) echo "$1" ;;
  esac
}

# huge_check <placement> <out.jsonl>: one server and client per peer at $HUGE.
huge_check() {
  local placement=$1 out=$2 spec name server client line
  for spec in "troupe=$BIN/troupe_echo_server:$BIN/troupe_echo_client" \
              "troupe_pool=$BIN/troupe_echo_server:$POOL_CLIENT" \
              "troupe_adopt=$BIN/troupe_echo_server:$ADOPT_CLIENT" \
              "raw=$WORK/build/raw_server:$WORK/build/raw_client"; do
    name=${spec%%=*}; server=${spec#*=}; client=${server#*:}; server=${server%%:*}
    start_server "$WORK/results/huge-$name-server.log" $(pin_args "$placement" server) "$server" \
      --addr 127.0.0.1:0
    if [ -n "$LISTEN" ]; then
      line=$(timeout 300 $(pin_args "$placement" client) "$client" --addr "$LISTEN" \
               --calls "$HUGE_CHECK_CALLS" --warmup 1 --payload "$HUGE" --inflight 1 2>/dev/null |
             tail -1) || true
      [ -n "$line" ] || line="{\"peer\":\"$name\",\"payload\":$(bytes "$HUGE"),\"inflight\":1,\"calls\":0,\"error\":\"no output\"}"
      echo "$line" | tee -a "$out" >&2
    fi
    stop_server
  done
}

STAMP=$(date +%Y%m%d-%H%M%S)
declare -A FILES
EXTRA_SPEC="troupe=$BIN/troupe_echo_server:$BIN/troupe_echo_client troupe_pool=$BIN/troupe_echo_server:$POOL_CLIENT troupe_adopt=$BIN/troupe_echo_server:$ADOPT_CLIENT"
log "peers:${RUN_PEERS} troupe troupe_pool troupe_adopt; placements: $PLACEMENTS; $REPS repetitions"
for rep in $(seq "$REPS"); do
  for placement in $PLACEMENTS; do
    pin=$placement; [ "$placement" = free ] && pin=""
    log "repetition $rep/$REPS, placement $placement, loadavg $(cut -d' ' -f1-3 /proc/loadavg)"
    out=$(WORK=$WORK SKIP_BUILD=1 PIN=$pin PEERS="$RUN_PEERS troupe troupe_pool troupe_adopt" \
            EXTRA="$EXTRA_SPEC" "$PEERS_DIR/run.sh" 2>&1 >/dev/null | tee /dev/stderr |
          sed -n 's/^\[run.sh\] results: //p')
    [ -n "$out" ] || { log "run.sh wrote no results"; exit 1; }
    FILES[$placement]="${FILES[$placement]:-} $WORK/$out"
  done
done
if [ -n "$HUGE" ]; then
  for placement in $PLACEMENTS; do
    out=$WORK/results/huge-$STAMP-$placement.jsonl
    : > "$out"
    log "$HUGE check, placement $placement"
    huge_check "$placement" "$out"
    FILES[$placement]="${FILES[$placement]} $out"
  done
fi

# ---------------------------------------------------------------- the table
args=()
for placement in $PLACEMENTS; do
  case $placement in
    same) title="PIN=same: client and server on CPU 0" ;;
    split) title="PIN=split: server on CPU 0, client on CPU 1" ;;
    free) title="unpinned: the scheduler decides" ;;
  esac
  args+=(--placement "$title" ${FILES[$placement]})
done
REPORT=$WORK/results/compare-$STAMP.md
{
  echo "# troupe vs the peers, $(date -Is), $(nproc) CPUs, loadavg $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "peers:${RUN_PEERS} troupe troupe_pool troupe_adopt; $REPS repetitions per placement"
  [ $WITH_GRPC = ON ] || echo "grpc skipped: one of $GRPC_PACKAGES is not installed"
  echo
  python3 "$ROOT/bench/peer_echo/compare_table.py" "${args[@]}"
} | tee "$REPORT"
log "report: $REPORT"
