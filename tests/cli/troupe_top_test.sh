#!/usr/bin/env bash
# troupe top end to end: a registry (troupe registry), two replicas of the test host actor (one
# serving /metrics through TROUPE_METRICS, one not), three calls of which one fails; then top's
# blocks (totals on the first, rates after), a call between two screens showing as a rate,
# SIGTERM stopping it with status 0, q quitting it on a terminal, and bad usage. Everything runs
# with a cluster token (so /metrics wants it as a Bearer token), which appears in no output.
# Every process started here is stopped by its own pid, also when the script fails. Nothing waits
# a fixed time (each step waits for a line), except the 3 s that show another key does not quit.
#
#   troupe_top_test.sh TROUPE TEST_HOST_ACTOR
set -euo pipefail
troupe=$1
host_actor=$2
source "$(dirname "$0")/cli_lib.sh"
# Plain TCP on loopback, with a cluster token of our own; nothing from the caller's environment.
unset TROUPE_TOKEN TROUPE_TLS_CA TROUPE_TLS_CERT TROUPE_TLS_KEY TROUPE_METRICS TROUPE_JOB_ID \
  TROUPE_TASK_INDEX TROUPE_NUM_TASKS
(umask 077 && openssl rand -hex 32 > "$out/token")
token=$(cat "$out/token")
export TROUPE_TOKEN_FILE="$out/token"

# Reads lines from fd $1 until one's fields (split on blanks) pass the test in $2, a command
# given the fields as its arguments (AWAIT_SECONDS, default 20, at most between two lines);
# prints that line.
await_row() {
  local fd=$1 test=$2 line
  while IFS= read -r -t "${AWAIT_SECONDS:-20}" line <&"$fd"; do
    # shellcheck disable=SC2086
    if "$test" $line; then echo "$line"; return 0; fi
  done
  fail "no line that passes $test"
}

# expect_status for troupe top, keeping what it printed in top.log.
expect_top() {
  local expected=$1
  shift
  expect_status "$expected" "$troupe" top "$@"
  printf '%s\n' "$output" >> "$out/top.log"
}

# member-0's row with a rate of calls above zero and a latency: NAME STATE CALLS/S P50 P99 ...
called_since_last_screen() {
  [ "${1:-}" = topjob/member-0 ] && [ "${3:-}" != - ] && [ "${3:-}" != 0.0 ] &&
    [[ ${4:-} =~ ^[0-9]+\.[0-9]+$ ]]
}

echo "== troupe registry"
mkfifo "$out/registry.out"
"$troupe" registry --listen tcp://127.0.0.1:0 --log-level warn > "$out/registry.out" \
  2> "$out/registry.err" &
pids+=($!)
exec 3< "$out/registry.out"
line=$(await_line 3 "LISTENING tcp://")
export TROUPE_RESOLVER="registry://${line#LISTENING tcp://}"

echo "== job topjob: member-0 serves /metrics, member-1 does not"
TROUPE_JOB_ID=topjob TROUPE_TASK_INDEX=0 TROUPE_METRICS=127.0.0.1:0 "$host_actor" \
  > "$out/member-0.log" 2>&1 &
pids+=($!)
TROUPE_JOB_ID=topjob TROUPE_TASK_INDEX=1 "$host_actor" > "$out/member-1.log" 2>&1 &
pids+=($!)
expect_status 0 "$troupe" wait topjob/ --count 2 --timeout 20s

echo "== three calls, one of which fails"
expect_status 0 "$troupe" call topjob/member-0 member.whoami '{}'
[ "$output" = '{"name":"topjob/member-0"}' ] || fail "whoami printed: $output"
expect_status 0 "$troupe" call topjob/member-0 member.calls '{}'
expect_status 1 "$troupe" call topjob/member-0 member.raise '{"message": "on purpose"}'
grep -q "on purpose" <<< "$output" || fail "raise printed: $output"

echo "== troupe top --iterations 2: a header, the columns and a row per member in each block"
expect_top 0 topjob/ --iterations 2 --interval 200ms
[ "$(grep -c '^troupe top topjob/  2 members  [0-9][0-9]:[0-9][0-9]:[0-9][0-9]$' \
      <<< "$output")" -eq 2 ] || fail "top's headers: $output"
[ "$(grep -c '^NAME  *STATE  *CALLS/S  *P50(ms)  *P99(ms)  *ERR/S  *ERRORS  *INFLIGHT$' \
      <<< "$output")" -eq 2 ] || fail "top's columns: $output"
! grep -q $'\x1b' <<< "$output" || fail "terminal codes in output that is not a terminal"
[ "$(grep -c '^topjob/member-0 ' <<< "$output")" -eq 2 ] || fail "member-0's rows: $output"
# The first block: totals, and '-' for rates.
read -r _ state rate p50 p99 error_rate errors in_flight rest \
  <<< "$(grep -m1 '^topjob/member-0 ' <<< "$output")"
[ "$state $rate $error_rate $errors $in_flight|$rest" = "ready - - 1 0|" ] ||
  fail "member-0's first row: $output"
[[ $p50 =~ ^[0-9]+\.[0-9]+$ && $p99 =~ ^[0-9]+\.[0-9]+$ ]] || fail "member-0's latency: $output"
# The second: rates over the 200 ms between the two, when no call was made.
read -r _ state rate p50 p99 error_rate errors in_flight rest \
  <<< "$(grep '^topjob/member-0 ' <<< "$output" | sed -n 2p)"
[ "$state $rate $p50 $p99 $error_rate $errors $in_flight" = "ready 0.0 - - 0.0 1 0" ] ||
  fail "member-0's second row: $output"
[ "$(grep -c '^topjob/member-1  *ready  *no metrics (TROUPE_METRICS unset)$' <<< "$output")" \
    -eq 2 ] || fail "member-1's rows: $output"

echo "== a call between two screens shows as a rate; SIGTERM stops top with status 0"
mkfifo "$out/top.out"
"$troupe" top topjob/ --interval 100ms > "$out/top.out" 2>&1 &
top_pid=$!
pids+=("$top_pid")
exec 4< "$out/top.out"
await_line 4 "topjob/member-0 " > /dev/null
expect_status 0 "$troupe" call topjob/member-0 member.whoami '{}'
row=$(await_row 4 called_since_last_screen)
read -r _ _ _ _ _ error_rate errors in_flight <<< "$row"
[ "$error_rate $errors $in_flight" = "0.0 1 0" ] || fail "member-0's row after a call: $row"
kill -TERM "$top_pid"
status=0
wait "$top_pid" || status=$?
[ "$status" -eq 0 ] || fail "troupe top exited with $status after SIGTERM"
exec 4<&-

echo "== without the token, the registry lets top in no more than anyone"
expect_status 1 env -u TROUPE_TOKEN_FILE "$troupe" top topjob/ --iterations 1
grep -q "^troupe top: .*requires the cluster token" <<< "$output" || fail "$output"

echo "== a prefix with no endpoints"
expect_top 0 nobody/ --iterations 1
grep -q '^troupe top nobody/  0 members  [0-9:]*$' <<< "$(head -1 <<< "$output")" ||
  fail "top of an empty prefix printed: $output"
[ "$(tail -n +2 <<< "$output")" = \
  $'NAME  STATE  CALLS/S  P50(ms)  P99(ms)  ERR/S  ERRORS  INFLIGHT\n(no endpoints)' ] ||
  fail "top of an empty prefix printed: $output"

echo "== on a terminal (script gives it one), q quits; another key does not"
# A key typed before top reads the terminal waits in its buffer: no race with top's start.
printf q | timeout 30 script -qec "'$troupe' top topjob/ --interval 200ms" /dev/null > "$out/top-q.log" ||
  fail "top on a terminal did not quit on q (status $?)"
status=0
printf x | timeout 3 script -qec "'$troupe' top topjob/ --interval 200ms" /dev/null > "$out/top-x.log" ||
  status=$?
[ "$status" -eq 124 ] || fail "top on a terminal ended on x (status $status)"

echo "== bad usage exits 2; a resolver that cannot be reached, 1"
expect_top 2
grep -q "^troupe top: missing argument PREFIX$" <<< "$output" || fail "$output"
grep -q "^Usage: troupe top " <<< "$output" || fail "no usage after a usage error: $output"
expect_top 2 topjob/ --interval 0s
grep -q -- "^troupe top: --interval needs a duration from 10ms to 24h such as 500ms, 30s, 2m or 1h, not '0s'$" \
  <<< "$output" || fail "$output"
expect_top 2 topjob/ --interval 25h
grep -q -- "--interval needs a duration from 10ms to 24h .* not '25h'" <<< "$output" || fail "$output"
expect_top 2 topjob/ --iterations many
grep -q -- "^troupe top: --iterations needs a whole number, not 'many'$" <<< "$output" ||
  fail "$output"
expect_top 2 topjob/ other/
expect_status 2 env -u TROUPE_RESOLVER "$troupe" top topjob/
grep -q "no resolver" <<< "$output" || fail "$output"
expect_top 1 topjob/ --resolver "registry+unix:$out/no-registry.sock"
grep -q "^troupe top: " <<< "$output" || fail "$output"
help=$("$troupe" --help 2>/dev/null) || fail "troupe --help failed"
grep -q "^  top  *show the endpoints under a prefix live" <<< "$help" ||
  fail "troupe --help printed: $help"
expect_top 0 --help
grep -q "^Usage: troupe top \[<option>...\] PREFIX$" <<< "$output" || fail "$output"

exec 3<&-
echo "== the token appears in no output and no log"
if grep -qF "$token" "$out"/*.log "$out/registry.err"; then
  fail "the token was written out"
fi
echo "troupe top test passed"
