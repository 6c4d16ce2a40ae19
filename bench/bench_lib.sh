# Sourced by bench/compare.sh and bench/same_host.sh after `set -euo pipefail`:
#   source "$(dirname "$0")/bench_lib.sh" NAME
# Sets ROOT (and changes there), BUILD, PEERS_DIR and WORK from the environment (see each
# script's knobs), configures BUILD with RelWithDebInfo when it has no CMakeCache.txt yet, and
# gives log(), start_server and stop_server.

BENCH_NAME=$1
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
BUILD=${BUILD:-build}
PEERS_DIR=${PEERS_DIR:-/work/shared/peers}
WORK=$(mkdir -p "${WORK:-$BUILD/peers}" && cd "${WORK:-$BUILD/peers}" && pwd)

log() { echo "[$BENCH_NAME] $*" >&2; }

if [ ! -f "$BUILD/CMakeCache.txt" ]; then
  cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTROUPE_WERROR=ON >&2
fi

# start_server LOG COMMAND...: runs COMMAND in the background with its stderr in LOG (troupe's
# servers log a line as they start listening) and waits up to 30 s for the "LISTENING <address>"
# line on its stdout. Sets SERVER_PID, and LISTEN to that address, or to "" after logging why
# when none came.
SERVER_PID=""
LISTEN=""
start_server() {
  local server_log=$1 line=""
  shift
  coproc SRV { exec "$@" 2>"$server_log"; }
  SERVER_PID=$SRV_PID
  while read -r -t 30 line <&"${SRV[0]}"; do
    [ "${line#LISTENING }" = "$line" ] || break
  done
  LISTEN=${line#LISTENING }
  if [ "$LISTEN" = "$line" ]; then
    LISTEN=""
    log "$* did not start: ${line:-no LISTENING line in 30 s}; its log: $server_log"
  fi
}

# stop_server: stops the server start_server started, if one runs, and waits for it.
stop_server() {
  if [ -n "$SERVER_PID" ]; then
    kill "$SERVER_PID" 2>/dev/null || true
    wait "$SERVER_PID" 2>/dev/null || true
  fi
  SERVER_PID=""
}
