# What the examples' demo.sh scripts share; sourced, after `set -euo pipefail` and bin=BIN_DIR.
#
#   demo_init                  a scratch directory $out, removed at exit, and the list $pids of
#                              background processes, each killed (SIGKILL) and reaped at exit if
#                              still running; credentials for everything the demo starts: a CA
#                              and a certificate (scripts/make_certs.sh) and a cluster token, in
#                              $out, named by TROUPE_TLS_CA, TROUPE_TLS_CERT, TROUPE_TLS_KEY and
#                              TROUPE_TOKEN_FILE (SECURITY.md)
#   await_line PREFIX          reads fd 3 until a line starts with PREFIX; prints the rest
#   start_registry             $TROUPE_REGISTRY (default $bin/troupe-registry) on a free TLS
#                              port: sets $registry (its URL) and $registry_pid; its output is
#                              fd 3
#   stop_registry              SIGTERM to it; fails unless it exits with status 0
#   start_resolver             the resolver the demo's jobs publish in: $TROUPE_RESOLVER when
#                              set (etcd://..., registry://...), else an etcd member on a unix
#                              socket in $out when DEMO_ETCD=1 (Debian's etcd-server), else
#                              start_registry; sets $registry (its URL)
#   stop_resolver              stops what start_resolver started, by its pid
#   expect_usage CMD...        runs CMD, which must print a usage message and exit with 2
#   run_demo NAME CMD...       runs CMD in the background (listed in $pids), its output to
#                              $out/demo.log, waits for it, prints that output, and fails
#                              unless NAME (CMD) exited with status 0

demo_init() {
  out=$(mktemp -d)
  pids=()
  trap demo_cleanup EXIT
  # From troupe's source tree, or as installed (troupe-make-certs).
  local make_certs="$(dirname "${BASH_SOURCE[0]}")/../scripts/make_certs.sh"
  [ -x "$make_certs" ] || make_certs=troupe-make-certs
  "$make_certs" "$out/certs"
  (umask 077 && openssl rand -hex 32 > "$out/token")
  export TROUPE_TLS_CA="$out/certs/ca.pem" TROUPE_TLS_CERT="$out/certs/node.pem"
  export TROUPE_TLS_KEY="$out/certs/node.key" TROUPE_TOKEN_FILE="$out/token"
}

demo_cleanup() {
  for pid in "${pids[@]}"; do
    if kill -0 "$pid" 2>/dev/null; then
      kill -KILL "$pid" 2>/dev/null || true
      wait "$pid" 2>/dev/null || true
    fi
  done
  rm -rf "$out"
}

await_line() {
  local prefix=$1 line
  while IFS= read -r -t 20 line <&3; do
    case $line in "$prefix"*) echo "${line#"$prefix"}"; return 0 ;; esac
  done
  echo "timed out waiting for '$prefix'" >&2
  return 1
}

start_registry() {
  mkfifo "$out/registry.out"
  "${TROUPE_REGISTRY:-$bin/troupe-registry}" --listen tls://127.0.0.1:0 --log-level warn \
    > "$out/registry.out" &
  registry_pid=$!
  pids+=("$registry_pid")
  exec 3< "$out/registry.out"
  registry="registry+tls://$(await_line "LISTENING tls://")"
  echo "registry at $registry (pid $registry_pid)"
}

stop_registry() {
  kill -TERM "$registry_pid"
  local status=0
  wait "$registry_pid" || status=$?
  [ "$status" -eq 0 ] || { echo "registry exited with $status" >&2; return 1; }
  cat <&3 > /dev/null
  exec 3<&-
}

start_resolver() {
  started_resolver=none
  if [ -n "${TROUPE_RESOLVER:-}" ]; then
    registry=$TROUPE_RESOLVER
    echo "resolver $registry (TROUPE_RESOLVER)"
  elif [ "${DEMO_ETCD:-0}" = 1 ]; then
    start_etcd
    started_resolver=etcd
  else
    start_registry
    started_resolver=registry
  fi
}

stop_resolver() {
  case $started_resolver in
    registry) stop_registry ;;
    etcd)
      kill -TERM "$etcd_pid"
      wait "$etcd_pid" || true
      exec 4<&-
      ;;
  esac
}

# One etcd member on unix sockets in $out (etcd takes them as NAME:PORT, relative to its working
# directory), ready once it says it serves clients; its log is fd 4.
start_etcd() {
  mkfifo "$out/etcd.log"
  (cd "$out" && exec etcd --name demo --data-dir "$out/etcd" \
    --listen-client-urls unix://etcd-client:1 --advertise-client-urls unix://etcd-client:1 \
    --listen-peer-urls unix://etcd-peer:1 --initial-advertise-peer-urls unix://etcd-peer:1 \
    --initial-cluster demo=unix://etcd-peer:1) 2> "$out/etcd.log" > /dev/null &
  etcd_pid=$!
  pids+=("$etcd_pid")
  exec 4< "$out/etcd.log"
  local line
  while IFS= read -r -t 30 line <&4; do
    case $line in *"ready to serve client requests"*) break ;; esac
  done
  [[ $line == *"ready to serve client requests"* ]] ||
    { echo "etcd did not start (pid $etcd_pid)" >&2; return 1; }
  # Keep draining its log so that it never blocks on a full pipe.
  cat <&4 > "$out/etcd.rest" &
  pids+=($!)
  registry="etcd+unix:$out/etcd-client:1"
  echo "etcd at $registry (pid $etcd_pid)"
}

expect_usage() {
  local status=0
  "$@" 2> "$out/usage.err" || status=$?
  [ "$status" -eq 2 ] || { echo "'$*' exited with $status, not 2" >&2; return 1; }
  grep -q '^usage: ' "$out/usage.err"
}

run_demo() {
  local name=$1 status=0
  shift
  "$@" > "$out/demo.log" 2>&1 &
  local pid=$!
  pids+=("$pid")
  wait "$pid" || status=$?
  cat "$out/demo.log"
  [ "$status" -eq 0 ] || { echo "$name exited with $status"; return 1; }
}
