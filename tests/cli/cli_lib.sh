# Helpers the troupe command's end-to-end tests source: a scratch folder $out, the pids of what
# they start (stopped by their own pid when the test exits, passing or not: SIGTERM, then SIGKILL),
# and waits on output.
# A test may set cleanup_extra to a function that undoes more (cancelling a Slurm job, say).

out=$(mktemp -d)
pids=()
cleanup_extra=
cleanup() {
  # SIGTERM first, so that a troupe launch stops its replicas (a SIGKILLed one would leave them
  # running); SIGKILL what has not exited 15 s later.
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do
    if kill -0 "$pid" 2>/dev/null; then
      timeout 15 tail --pid="$pid" -f /dev/null 2>/dev/null || true
      kill -KILL "$pid" 2>/dev/null || true
    fi
    wait "$pid" 2>/dev/null || true
  done
  if [ -n "$cleanup_extra" ]; then "$cleanup_extra" || true; fi
  rm -rf "$out"
}
trap cleanup EXIT
fail() { echo "FAILED: $*" >&2; exit 1; }

# Reads lines from fd $1 until one contains $2 (AWAIT_SECONDS, default 20, at most between two
# lines); prints that line.
await_line() {
  local fd=$1 text=$2 line
  while IFS= read -r -t "${AWAIT_SECONDS:-20}" line <&"$fd"; do
    case $line in *"$text"*) echo "$line"; return 0 ;; esac
  done
  fail "no line containing '$text'"
}

# Runs the command in "$@", expecting exit status $expected; its stdout+stderr in $output.
expect_status() {
  local expected=$1
  shift
  local status=0
  output=$("$@" 2>&1) || status=$?
  [ "$status" -eq "$expected" ] || fail "'$*' exited with $status, not $expected: $output"
}
