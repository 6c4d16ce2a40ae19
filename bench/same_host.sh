#!/usr/bin/env bash
# Same host (README, "Same host"), in one run on this machine: one core's memcpy, raw loopback
# TCP, troupe over loopback TCP and troupe over a unix socket (a blob read out of the sender's
# memory, or through shared memory with sameHostReads off; large messages through shared
# memory), for a 1 GiB blob, 64 MiB echo calls (1 and 4 in flight) and 1 MiB echo calls (1 and
# 32 in flight); a 1 GiB chain broadcast to 4 receivers on this host; and the floors of one
# same-host copy into touched memory (through process_vm_readv, from a shared mapping). Medians
# of REPS runs.
# The last line is
#   same-host 1GiB blob: S GB/s; loopback TCP raw: T GB/s; memcpy: M GB/s
#
#   bench/same_host.sh              # ~5 min on an idle 2-vCPU machine, plus builds
#
# Knobs (environment):
#   BUILD=build          troupe build dir (configured with RelWithDebInfo if it has none)
#   PEERS_DIR=/work/shared/peers   the peer harness, for raw_server and raw_client
#   WORK=$BUILD/peers    where the peers are built
#   REPS=3               runs of each measurement (the medians are reported)
set -euo pipefail

source "$(dirname "$0")/bench_lib.sh" same_host.sh
REPS=${REPS:-3}

log "building blob_bench bench_blob_member troupe_echo_server troupe_echo_client in $BUILD"
cmake --build "$BUILD" --target blob_bench bench_blob_member troupe_echo_server \
  troupe_echo_client >&2
BIN=$(cd "$BUILD/bin" && pwd)
log "building raw_server raw_client in $WORK/build"
cmake -S "$PEERS_DIR" -B "$WORK/build" -DCMAKE_BUILD_TYPE=Release -DPEERS_WITH_GRPC=OFF \
  -DPEERS_WITH_CAF=OFF > /dev/null
cmake --build "$WORK/build" --target raw_server raw_client > /dev/null

TMP=$(mktemp -d /tmp/troupe-same-host-bench-XXXXXX)
cleanup() {
  stop_server
  rm -rf "$TMP"
}
trap cleanup EXIT INT TERM

# ---------------------------------------------------------------- blobs and memcpy
log "blobs: memcpy, raw TCP, troupe over TCP, same host, chain of 4 ($REPS runs each)"
"$BIN/blob_bench" \
  --benchmark_filter='^BM_Memcpy/1024|^BM_RawTcp_Loopback/1024|^BM_Blob_Loopback/1024/0/0|^BM_Blob_SameHost(Shared)?/1024/0/0|^BM_Blob_SameHostChain(Shared)?/1024/0/0/4|^BM_ProcessVmReadv/0|^BM_SharedMappingCopy/0' \
  --benchmark_repetitions="$REPS" --benchmark_enable_random_interleaving=true \
  --benchmark_report_aggregates_only=true \
  --benchmark_out="$TMP/blobs.json" --benchmark_out_format=json > /dev/null

# ---------------------------------------------------------------- echo calls
# echo <name> <server> <client> <address> <payload> <inflight> <calls> <warmup>: one JSON line.
CALLS="$TMP/calls.jsonl"
: > "$CALLS"
echo_run() {
  local name=$1 server=$2 client=$3 address=$4 payload=$5 inflight=$6 calls=$7 warmup=$8 line
  start_server "$TMP/$name-server.log" "$server" --addr "$address"
  if [ -n "$LISTEN" ]; then
    line=$(timeout 300 "$client" --addr "$LISTEN" --calls "$calls" --warmup "$warmup" \
             --payload "$payload" --inflight "$inflight" 2>/dev/null | tail -1) || true
    [ -n "$line" ] && echo "{\"name\":\"$name\",\"row\":$line}" >> "$CALLS"
  fi
  stop_server
}
for rep in $(seq "$REPS"); do
  log "echo calls, run $rep/$REPS"
  for cell in "64M 1 6 1" "64M 4 12 4" "1M 1 200 20" "1M 32 2000 200"; do
    set -- $cell
    echo_run raw "$WORK/build/raw_server" "$WORK/build/raw_client" 127.0.0.1:0 "$@"
    echo_run troupe_tcp "$BIN/troupe_echo_server" "$BIN/troupe_echo_client" 127.0.0.1:0 "$@"
    echo_run troupe_same_host "$BIN/troupe_echo_server" "$BIN/troupe_echo_client" \
      "unix:$TMP/echo.sock" "$@"
    rm -f "$TMP/echo.sock"
  done
done

# ---------------------------------------------------------------- the report
python3 - "$TMP/blobs.json" "$CALLS" "$REPS" <<'EOF'
import json, statistics, sys

blobs = json.load(open(sys.argv[1]))
calls = [json.loads(l) for l in open(sys.argv[2]) if l.strip()]
reps = sys.argv[3]

def median_gbps(prefix):
    # The median aggregate; with one run, the run itself.
    runs = [b for b in blobs["benchmarks"] if b["name"].startswith(prefix)]
    for b in runs:
        if b.get("aggregate_name") == "median" or len(runs) == 1:
            return b["bytes_per_second"] / 1e9, b.get("sender_extra_mib"), b.get("member_extra_mib")
    return None, None, None

print(f"# same host, {len(open('/proc/cpuinfo').read().split('processor')) - 1} CPUs, "
      f"medians of {reps}")
print()
print("| 1 GiB | GB/s | sender extra MiB | receiver extra MiB |")
print("|---|---:|---:|---:|")
rows = [("memcpy, one core", "BM_Memcpy/1024"),
        ("raw loopback TCP", "BM_RawTcp_Loopback/1024"),
        ("troupe blob over loopback TCP", "BM_Blob_Loopback/1024/0/0"),
        ("troupe blob, same host (read from the sender)", "BM_Blob_SameHost/1024/0/0"),
        ("troupe blob, same host, through shared memory", "BM_Blob_SameHostShared/1024/0/0"),
        ("troupe blob, same host, chain of 4", "BM_Blob_SameHostChain/1024/0/0/4"),
        ("troupe blob, same host, chain of 4, shared memory",
         "BM_Blob_SameHostChainShared/1024/0/0/4"),
        ("floor: process_vm_readv into touched memory", "BM_ProcessVmReadv/0"),
        ("floor: copy from a shared mapping", "BM_SharedMappingCopy/0")]
got = {}
for label, prefix in rows:
    gbps, sender, member = median_gbps(prefix)
    got[prefix] = gbps
    fmt = lambda v: "" if v is None else f"{v:.0f}"
    print(f"| {label} | {'n/a' if gbps is None else f'{gbps:.2f}'} | {fmt(sender)} | {fmt(member)} |")
print()
print("| echo calls | raw TCP MB/s | troupe TCP MB/s | x raw | troupe same host MB/s | x raw |")
print("|---|---:|---:|---:|---:|---:|")
cells = {}
for c in calls:
    r = c["row"]
    if "error" in r or not r.get("calls"):
        continue
    cells.setdefault((r["payload"], r["inflight"]), {}).setdefault(c["name"], []).append(r["MBps"])
for (payload, k) in sorted(cells, key=lambda pk: (-pk[0], pk[1])):
    m = {n: statistics.median(v) for n, v in cells[(payload, k)].items()}
    raw = m.get("raw")
    def ratio(n):
        return "" if raw is None or n not in m else f"{m[n] / raw:.2f}x"
    size = f"{payload >> 20} MiB"
    print(f"| {size} x {k} | {m.get('raw', 0):.0f} | {m.get('troupe_tcp', 0):.0f} | "
          f"{ratio('troupe_tcp')} | {m.get('troupe_same_host', 0):.0f} | {ratio('troupe_same_host')} |")
print()
s = got.get("BM_Blob_SameHost/1024/0/0")
t = got.get("BM_RawTcp_Loopback/1024")
mc = got.get("BM_Memcpy/1024")
f = lambda v: "n/a" if v is None else f"{v:.2f}"
print(f"same-host 1GiB blob: {f(s)} GB/s; loopback TCP raw: {f(t)} GB/s; memcpy: {f(mc)} GB/s")
EOF
