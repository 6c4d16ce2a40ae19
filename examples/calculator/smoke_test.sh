#!/usr/bin/env bash
# Starts calculator_server, runs calculator_client against it, checks the results, and stops
# the server by its pid with SIGTERM (it drains and exits 0).
#   smoke_test.sh BIN_DIR
set -euo pipefail
bin=$1
out=$(mktemp -d)
server_pid=""
cleanup() {
  if [ -n "$server_pid" ] && kill -0 "$server_pid" 2>/dev/null; then
    kill -KILL "$server_pid" 2>/dev/null || true
    wait "$server_pid" 2>/dev/null || true
  fi
  rm -rf "$out"
}
trap cleanup EXIT

# The server's output comes through a fifo, so its address is read as soon as it is printed.
mkfifo "$out/server.out"
"$bin/calculator_server" --listen tcp://127.0.0.1:0 > "$out/server.out" 2>&1 &
server_pid=$!
exec 3< "$out/server.out"
address=""
while IFS= read -r -t 20 line <&3; do
  echo "server: $line" >> "$out/server.log"
  case $line in
    "calculator serving at "*) address=$(echo "$line" | cut -d' ' -f4); break ;;
  esac
done
[ -n "$address" ] || { echo "server did not start"; cat "$out/server.log"; exit 1; }

"$bin/calculator_client" "$address" | tee "$out/client.log"
grep -q '^add(1.5, 2.25) = 3.75$' "$out/client.log"
grep -q '^100 / 1..4 = 100 50 33.3333 25$' "$out/client.log"
grep -q '^sum(1..1000) = 500500$' "$out/client.log"
grep -q 'divide(1, 0) failed as expected: failed (.*cannot divide by zero' "$out/client.log"
grep -q '^the actor has served 8 calls' "$out/client.log"

kill -TERM "$server_pid"
status=0
wait "$server_pid" || status=$?
server_pid=""
cat <&3 >> "$out/server.log"
exec 3<&-
[ "$status" -eq 0 ] || { echo "server exited with $status"; exit 1; }
grep -q 'stopped' "$out/server.log"
echo "calculator smoke test passed"
