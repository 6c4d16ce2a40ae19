#!/usr/bin/env bash
# The troupe command end to end: a registry (troupe registry), a job launched in the foreground
# (troupe launch) whose replicas host the calculator example's actor, then troupe wait, ls,
# actors, call, jobs, logs and stop against them, Data as base64 against the test server's Echo
# actor, a call whose reply a fault proxy cuts (it runs once), bad input, clients without the
# token or the CA, listeners refused without credentials, and Ctrl-C stopping the job. Everything runs with TLS and a cluster token, from the environment
# (certificates made here by scripts/make_certs.sh). Every process started here is stopped by
# its own pid, also when the script fails. A command that should fail at once is given a long
# timeout: the test's own timeout catches one that waits instead.
#
#   troupe_cli_test.sh TROUPE CALCULATOR_SERVER TEST_SERVER FAULT_PROXY
set -euo pipefail
troupe=$1
server=$2
test_server=$3
fault_proxy=$4
source "$(dirname "$0")/cli_lib.sh"

echo "== credentials: a CA, a certificate and a cluster token"
"$(dirname "$0")/../../scripts/make_certs.sh" "$out/certs"
(umask 077 && openssl rand -hex 32 > "$out/token")
token=$(cat "$out/token")
export TROUPE_TLS_CA="$out/certs/ca.pem" TROUPE_TLS_CERT="$out/certs/node.pem"
export TROUPE_TLS_KEY="$out/certs/node.key" TROUPE_TOKEN_FILE="$out/token"

echo "== troupe registry"
mkfifo "$out/registry.out"
(umask 077 && openssl rand -hex 32 > "$out/admin-token")
"$troupe" registry --listen tls://127.0.0.1:0 --log-level warn --max-connections 256 \
  --admin-token-file "$out/admin-token" \
  --max-incomplete-bytes 67108864 --max-queued-event-bytes 16777216 --max-endpoints 1000 \
  --max-watchers 100 --max-jobs 100 > "$out/registry.out" 2> "$out/registry.err" &
registry_pid=$!
pids+=("$registry_pid")
exec 3< "$out/registry.out"
line=$(await_line 3 "LISTENING tls://")
export TROUPE_RESOLVER="registry+tls://${line#LISTENING tls://}"

echo "== troupe launch: job calc, 2 replicas"
mkfifo "$out/launch.out"
"$troupe" launch --name calc --replicas 2 --cpu 0.1 --ram 64m --log-dir "$out/logs" \
  -- "$server" > "$out/launch.out" 2>&1 &
launch_pid=$!
pids+=("$launch_pid")
exec 4< "$out/launch.out"
await_line 4 "job calc: running" > /dev/null

echo "== troupe wait"
expect_status 0 "$troupe" wait calc/ --count 2 --timeout 20s
[ "$output" = $'calc/calc-0\ncalc/calc-1' ] || fail "wait printed: $output"
expect_status 1 "$troupe" wait calc/ --count 3 --timeout 300ms
grep -q "2 of 3 endpoints under 'calc/' ready after 300ms" <<< "$output" || fail "$output"

echo "== a second launch of a live job's name is refused, and leaves the job alone"
expect_status 1 "$troupe" launch --name calc --log-dir "$out/logs2" -- "$server"
grep -q "job calc: failed: job 'calc' already exists and is live" <<< "$output" || fail "$output"
expect_status 0 "$troupe" wait calc/ --count 2 --timeout 20s
[ "$output" = $'calc/calc-0\ncalc/calc-1' ] || fail "wait after the refused launch printed: $output"

echo "== troupe ls"
expect_status 0 "$troupe" ls calc/
[ "$(grep -c '^calc/calc-[01] tls://127.0.0.1:[0-9]* ready [0-9]* [0-9]*s$' <<< "$output")" -eq 2 ] ||
  fail "ls printed: $output"
expect_status 0 "$troupe" ls nothing-here/
[ -z "$output" ] || fail "ls of an empty prefix printed: $output"

echo "== troupe actors"
expect_status 0 "$troupe" actors calc/calc-0
grep -q '^  calc: calculator.capnp:Calculator$' <<< "$output" || fail "$output"
grep -q '^    add (a :Float64, b :Float64) -> (value :Float64)$' <<< "$output" || fail "$output"
grep -q '^    sum (values :List(Float64)) -> (value :Float64)$' <<< "$output" || fail "$output"

echo "== troupe call"
expect_status 0 "$troupe" call calc/calc-0 calc.add '{"a": 1.5, "b": 2}'
[ "$output" = '{"value":3.5}' ] || fail "call printed: $output"
expect_status 0 "$troupe" call calc/ calc.sum '{"values": [1, 2, 3]}' --all
[ "$output" = $'calc/calc-0 {"value":6}\ncalc/calc-1 {"value":6}' ] || fail "call --all printed: $output"
expect_status 0 "$troupe" call calc/calc-1 calc.sum '{"values": [1, 2]}' --all
[ "$output" = 'calc/calc-1 {"value":3}' ] || fail "call --all of one endpoint printed: $output"
expect_status 1 "$troupe" call calc/ calc.divide '{"a": 1, "b": 0}' --all
[ "$(grep -c '^calc/calc-[01] error: .*cannot divide by zero$' <<< "$output")" -eq 2 ] ||
  fail "call --all of a failing method printed: $output"
expect_status 0 "$troupe" call calc calc.sum '{"values": [1]}' --all
[ "$output" = $'calc/calc-0 {"value":1}\ncalc/calc-1 {"value":1}' ] || fail "call --all printed: $output"
address=$(sed -n 's/^calc\/calc-1 \(tls:[^ ]*\) .*/\1/p' <<< "$("$troupe" ls calc/calc-1)")
expect_status 0 "$troupe" call "$address" calc.calls
grep -q '^{"count":[0-9][0-9]*}$' <<< "$output" || fail "call by address printed: $output"

echo "== troupe call: the JSON from a file (@FILE) or from standard input (-)"
printf '{"a": 1.5,\n "b": 2}\n' > "$out/add.json"
expect_status 0 "$troupe" call calc/calc-0 calc.add "@$out/add.json"
[ "$output" = '{"value":3.5}' ] || fail "call @FILE printed: $output"
expect_status 0 "$troupe" call calc/calc-0 calc.add - < "$out/add.json"
[ "$output" = '{"value":3.5}' ] || fail "call - printed: $output"
# Larger than one argument of a command line may be (128 KiB on Linux).
{ printf '{"values": ['; seq -s ', ' 1 100000 | tr -d '\n'; printf ']}'; } > "$out/sum.json"
[ "$(stat -c %s "$out/sum.json")" -gt 131072 ] || fail "sum.json fits in an argument"
expect_status 0 "$troupe" call calc/calc-0 calc.sum "@$out/sum.json"
[ "$output" = '{"value":5000050000}' ] || fail "call of a large @FILE printed: $output"
expect_status 0 "$troupe" call calc/ calc.sum - --all < "$out/sum.json"
[ "$output" = $'calc/calc-0 {"value":5000050000}\ncalc/calc-1 {"value":5000050000}' ] ||
  fail "call --all of a large - printed: $output"
expect_status 1 "$troupe" call calc/ calc.add "@$out/no-such.json"
grep -qxF "troupe call: cannot read the JSON parameters from '$out/no-such.json': No such file or directory" \
  <<< "$output" || fail "$output"
expect_status 1 "$troupe" call calc/ calc.add "@$out"
grep -qxF "troupe call: cannot read the JSON parameters from '$out': Is a directory" <<< "$output" ||
  fail "$output"
printf '{"a": 1, "b": 2}\0{}' > "$out/nul.json"
expect_status 1 "$troupe" call calc/ calc.add "@$out/nul.json"
grep -qxF "troupe call: the JSON parameters from '$out/nul.json' hold a NUL byte (at byte 17), which JSON text never does" \
  <<< "$output" || fail "$output"
printf '{"a": 1,\n' > "$out/cut.json"
expect_status 1 "$troupe" call calc/ calc.add - < "$out/cut.json"
grep -qxF "troupe call: '{\"a\": 1,\x0a' is not valid JSON: it ends where a field name in double quotes should be" \
  <<< "$output" || fail "$output"
expect_status 2 "$troupe" call calc/ calc.add @
grep -qxF "troupe call: '@' needs a file name: @FILE reads the JSON from FILE" <<< "$output" ||
  fail "$output"

echo "== troupe call refuses parameters left out, unless --partial"
expect_status 1 "$troupe" call calc/ calc.add '{"a": 1}'
grep -qxF "troupe call: calc.add is missing parameter 'b': give it, or say --partial to let it take its default" \
  <<< "$output" || fail "$output"
expect_status 1 "$troupe" call calc/ calc.add
grep -qxF "troupe call: calc.add is missing parameters 'a', 'b': give them, or say --partial to let them take their defaults" \
  <<< "$output" || fail "$output"
expect_status 1 "$troupe" call calc/ calc.sum '{}' --all
grep -qxF "troupe call: calc.sum is missing parameter 'values': give it, or say --partial to let it take its default" \
  <<< "$output" || fail "$output"
expect_status 0 "$troupe" call calc/ calc.add '{"a": 1}' --partial
[ "$output" = '{"value":1}' ] || fail "call --partial printed: $output"
expect_status 0 "$troupe" call calc/ calc.add --partial
[ "$output" = '{"value":0}' ] || fail "call --partial without JSON printed: $output"
expect_status 0 "$troupe" call calc/ calc.sum '{}' --all --partial
[ "$output" = $'calc/calc-0 {"value":0}\ncalc/calc-1 {"value":0}' ] ||
  fail "call --all --partial printed: $output"

echo "== troupe call: Data as base64, against the test server's Echo actor"
mkfifo "$out/test_server.out"
env -u TROUPE_RESOLVER "$test_server" > "$out/test_server.out" &
test_server_pid=$!
pids+=("$test_server_pid")
exec 6< "$out/test_server.out"
line=$(await_line 6 "LISTENING tcp://")
echo_address=$(cut -d' ' -f2 <<< "$line")
expect_status 0 "$troupe" call "$echo_address" echo.echo '{"payload": "aGVsbG8gdHJvdXBl"}'
[ "$output" = '{"payload":"aGVsbG8gdHJvdXBl"}' ] || fail "echo printed: $output"
expect_status 0 "$troupe" call "$echo_address" echo.echo '{"payload": "AAH/+w=="}'
[ "$output" = '{"payload":"AAH/+w=="}' ] || fail "echo of binary bytes printed: $output"
expect_status 1 "$troupe" call "$echo_address" echo.echo '{"payload": [104, 105]}'
grep -q '^troupe call: parameter .payload. of echo.echo is Data, a base64 string; got \[104,105\]$' \
  <<< "$output" || fail "$output"
expect_status 1 "$troupe" call "$echo_address" echo.echo '{"payload": "not base64!"}'
grep -q "^troupe call: parameter 'payload' of echo.echo is Data, a base64 string" <<< "$output" ||
  fail "$output"

echo "== troupe call: 64-bit integers as numbers up to 2^53, as strings beyond (the test server's calc)"
expect_status 0 "$troupe" call "$echo_address" calc.add '{"a": 9007199254740991, "b": 1}'
[ "$output" = '{"sum":9007199254740992}' ] || fail "2^53 printed: $output"
expect_status 0 "$troupe" call "$echo_address" calc.add '{"a": "9007199254740992", "b": 1}'
[ "$output" = '{"sum":"9007199254740993"}' ] || fail "2^53 + 1 printed: $output"
expect_status 0 "$troupe" call "$echo_address" calc.add '{"a": -9007199254740992, "b": 0}'
[ "$output" = '{"sum":-9007199254740992}' ] || fail "-2^53 printed: $output"
expect_status 0 "$troupe" call "$echo_address" calc.add '{"a": "-9007199254740992", "b": -1}'
[ "$output" = '{"sum":"-9007199254740993"}' ] || fail "-2^53 - 1 printed: $output"
expect_status 0 "$troupe" call "$echo_address" calc.add '{"a": 1000000000000000, "b": -7}'
[ "$output" = '{"sum":999999999999993}' ] || fail "10^15 - 7 printed: $output"
expect_status 0 "$troupe" call "$echo_address" calc.add '{"a": 1000000000000000, "b": 0}'
[ "$output" = '{"sum":1000000000000000}' ] || fail "10^15 printed: $output"
expect_status 0 "$troupe" call "$echo_address" calc.add '{"a": "9223372036854775806", "b": 1}'
[ "$output" = '{"sum":"9223372036854775807"}' ] || fail "2^63 - 1 printed: $output"
expect_status 1 "$troupe" call "$echo_address" calc.add '{"a": 9007199254740995, "b": 0}'
grep -qxF "troupe call: parameter 'a' of calc.add is an Int64; got 9007199254740996: a JSON number of magnitude beyond 2^53 may have lost digits: give it as a string of digits instead" \
  <<< "$output" || fail "$output"
expect_status 1 "$troupe" call "$echo_address" calc.add '{"a": 1.5, "b": 0}'
grep -qxF "troupe call: parameter 'a' of calc.add is an Int64; got 1.5" <<< "$output" ||
  fail "$output"

echo "== troupe call: a call whose reply is cut on its way back gets it and runs once"
mkfifo "$out/proxy.out"
"$fault_proxy" "$echo_address" --cut-once-call before-reply > "$out/proxy.out" &
proxy_pid=$!
pids+=("$proxy_pid")
exec 7< "$out/proxy.out"
line=$(await_line 7 "LISTENING tcp://")
proxy_address=$(cut -d' ' -f2 <<< "$line")
expect_status 0 "$troupe" call "$proxy_address" member.whoami
[ "$output" = '{"name":"test/member-0"}' ] || fail "whoami through the proxy printed: $output"
await_line 7 "CUT " > /dev/null
expect_status 0 "$troupe" call "$echo_address" member.calls
[ "$output" = '{"count":1}' ] || fail "the member counted, after one cut call: $output"
kill -TERM "$proxy_pid"
wait "$proxy_pid" || fail "the fault proxy did not stop cleanly on SIGTERM"
exec 7<&-
kill -TERM "$test_server_pid"
wait "$test_server_pid" || fail "the test server did not stop cleanly on SIGTERM"
exec 6<&-

echo "== without the token or the CA, nothing is let in"
expect_status 1 env -u TROUPE_TOKEN_FILE "$troupe" ls calc/
grep -q "^troupe ls: .*requires the cluster token, and none was presented" <<< "$output" ||
  fail "$output"
(umask 077 && echo "not-the-token" > "$out/wrong-token")
expect_status 1 env TROUPE_TOKEN_FILE="$out/wrong-token" "$troupe" call calc/ calc.add '{"a": 1, "b": 2}'
grep -q "the cluster token presented is not this server's" <<< "$output" || fail "$output"
expect_status 1 env -u TROUPE_TOKEN_FILE "$troupe" call "$address" calc.calls
grep -q "requires the cluster token" <<< "$output" || fail "$output"
echo "loose" > "$out/loose-token" && chmod 644 "$out/loose-token"
expect_status 1 env TROUPE_TOKEN_FILE="$out/loose-token" "$troupe" ls calc/
grep -q "other users may read it (mode 644); make it readable by its owner only" <<< "$output" ||
  fail "$output"
expect_status 1 env -u TROUPE_TLS_CA "$troupe" ls calc/
grep -q "TLS peer's certificate is not trusted" <<< "$output" || fail "$output"
expect_status 0 env -u TROUPE_TLS_CA -u TROUPE_TOKEN_FILE "$troupe" ls calc/ \
  --tls-ca "$out/certs/ca.pem" --token-file "$out/token"
grep -q "^calc/calc-0 tls://" <<< "$output" || fail "ls with flags printed: $output"

echo "== the registry's bounds take whole numbers"
expect_status 2 "$troupe" registry --max-connections 0
grep -q -- "--max-connections needs a whole number of at least 1, not '0'" <<< "$output" ||
  fail "$output"
expect_status 2 "$troupe" registry --max-jobs many
grep -q -- "--max-jobs needs a whole number of at least 1, not 'many'" <<< "$output" ||
  fail "$output"

echo "== listeners other machines may reach are refused without credentials"
expect_status 1 env -u TROUPE_TOKEN_FILE "$troupe" registry --listen tcp://0.0.0.0:0
grep -q "refusing to listen on tcp://0.0.0.0:0 without credentials" <<< "$output" || fail "$output"
grep -q "or say --insecure to allow it" <<< "$output" || fail "$output"
expect_status 1 env -u TROUPE_TOKEN_FILE -u TROUPE_RESOLVER TROUPE_ADVERTISE_HOST=replica.invalid \
  "$server"
grep -q "refusing to listen on tls://0.0.0.0:0 without credentials" <<< "$output" || fail "$output"
grep -q "or say TROUPE_INSECURE=1 to allow it" <<< "$output" || fail "$output"

echo "== bad input"
expect_status 1 "$troupe" call calc/ calc.nope '{}'
grep -q "Calculator has no method 'nope' (its methods: add, divide, sum, calls)" <<< "$output" || fail "$output"
expect_status 1 "$troupe" call calc/ calc.add '{"x": 1}'
grep -q "^troupe call: calc.add has no parameter 'x' (it has a, b)$" <<< "$output" || fail "$output"
expect_status 1 "$troupe" call calc/ calc.add '{"a": "x", "b": 2}'
grep -q '^troupe call: parameter .a. of calc.add is a Float64; got "x"$' <<< "$output" ||
  fail "$output"
expect_status 1 "$troupe" call calc/ calc.add '{"a":'
grep -q "^troupe call: '{\"a\":' is not valid JSON: it ends where a value should be$" <<< "$output" ||
  fail "$output"
expect_status 1 "$troupe" call calc/ calc.add 'not json'
grep -q "^troupe call: 'not json' is not valid JSON: 'n' at byte 1 where a value should be$" \
  <<< "$output" || fail "$output"
expect_status 1 "$troupe" call calc/ calc.add '[1, 2]'
grep -q "^troupe call: calc.add takes a JSON object of its parameters (a, b), not '\[1, 2\]'$" \
  <<< "$output" || fail "$output"
! grep -q "expected \|\.c++:\|\.cpp:" <<< "$output" || fail "kj internals in: $output"
expect_status 1 "$troupe" call calc/ calc.divide '{"a": 1, "b": 0}'
grep -q "cannot divide by zero" <<< "$output" || fail "$output"
expect_status 1 "$troupe" call calc/ nobody.add '{}'
grep -q "no actor named 'nobody'" <<< "$output" || fail "$output"
expect_status 1 "$troupe" call nojob/ calc.add '{}'
expect_status 2 "$troupe" call calc/ calc-without-method
expect_status 2 "$troupe" ls --bogus
expect_status 2 "$troupe" bogus
grep -q "^troupe: bogus: unknown command$" <<< "$output" || fail "$output"
expect_status 2 "$troupe"
expect_status 2 "$troupe" wait calc/ --count x
grep -q "^troupe wait: --count needs a whole number of at least 1, not 'x'$" <<< "$output" ||
  fail "$output"
grep -q "^Usage: troupe wait " <<< "$output" || fail "no usage after a usage error: $output"
echo "== every duration flag takes one format: a number and its unit"
expect_status 2 "$troupe" call calc/ calc.add --timeout=soon
grep -q "^troupe call: --timeout needs a duration from 1ms to 1000000h such as 500ms, 30s, 2m or 1h, not 'soon'$" \
  <<< "$output" || fail "$output"
expect_status 2 "$troupe" wait calc/ --count 1 --timeout 30
grep -q "^troupe wait: --timeout needs a duration .* not '30'$" <<< "$output" || fail "$output"
expect_status 2 "$troupe" registry --default-ttl 0.5ms
grep -q "^troupe registry: --default-ttl needs a duration from 1ms .* not '0.5ms'$" <<< "$output" ||
  fail "$output"
expect_status 0 "$troupe" call calc/ calc.add '{"a": 1, "b": 2}' --timeout 1.5m
[ "$output" = '{"value":3}' ] || fail "call with --timeout 1.5m printed: $output"
help=$("$troupe" --help 2>/dev/null) || fail "troupe --help failed"
grep -q "^  call " <<< "$help" || fail "troupe --help printed: $help"
help=$("$troupe" call --help 2>/dev/null) || fail "troupe call --help failed"
grep -q "^Usage: troupe call .*TARGET ACTOR.METHOD \[JSON\]$" <<< "$help" || fail "$help"
grep -q "^ *--partial$" <<< "$help" || fail "troupe call --help has no --partial: $help"
tr -s '\n ' ' ' <<< "$help" | grep -q "JSON may be @FILE to read it from FILE, or - to read it from" ||
  fail "troupe call --help does not say @FILE and -: $help"
version=$("$troupe" --version 2>/dev/null) || fail "troupe --version failed"
grep -q "^troupe [0-9][0-9]*\.[0-9][0-9]*\.[0-9][0-9]*$" <<< "$version" || fail "--version: $version"
expect_status 2 env -u TROUPE_RESOLVER "$troupe" ls
grep -q "no resolver" <<< "$output" || fail "$output"
expect_status 0 "$troupe" launch --help
expect_status 1 "$troupe" launch --name missing -- "$out/no-such-program"
grep -q "no such file or directory" <<< "$output" || fail "$output"
echo "== troupe launch fails, saying why, when the resolver refuses it or cannot be reached"
expect_status 1 env -u TROUPE_TOKEN_FILE "$troupe" launch --name refused --log-dir "$out/logs" -- "$server"
grep -q "^job refused: failed: the resolver refused to create the job: .*requires the cluster token" \
  <<< "$output" || fail "$output"
! grep -q "job refused: running" <<< "$output" || fail "a refused job showed as running: $output"
port=$(/usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
expect_status 1 "$troupe" launch --name nowhere --resolver "registry+tls://127.0.0.1:$port" \
  --log-dir "$out/logs" -- "$server"
grep -q "^job nowhere: waiting for the resolver" <<< "$output" || fail "$output"
grep -q "^job nowhere: failed: the resolver could not create the job within 5000 ms: cannot connect" \
  <<< "$output" || fail "$output"
! grep -q "job nowhere: running" <<< "$output" || fail "an uncreated job showed as running: $output"
expect_status 1 "$troupe" launch --name false --max-retries 1 -- false
grep -q "job false: failed: replica 0 (pid [0-9]*) exited with status 1: failure 2" <<< "$output" || fail "$output"

echo "== troupe jobs: every job the registry knows, running ones first"
expect_status 0 "$troupe" jobs
head -1 <<< "$output" | grep -Eq "^calc running 2/2 local [0-9]+s - -$" || fail "jobs printed: $output"
grep -q "^false failed 0/1 local [0-9]*s [0-9]*s replica 0 (pid [0-9]*) exited with status 1: failure 2" \
  <<< "$output" || fail "jobs printed: $output"
grep -q "^missing failed 0/1 local [0-9]*s [0-9]*s replica 0 could not start: .*no such file" \
  <<< "$output" || fail "jobs printed: $output"
# On a terminal (script gives the command one), aligned columns under a header.
terminal=$(script -qec "'$troupe' jobs" /dev/null | tr -d '\r')
grep -Eq "^NAME +STATE +READY +LAUNCHER +AGE +ENDED +REASON$" <<< "$terminal" ||
  fail "jobs on a terminal printed: $terminal"
grep -Eq "^calc +running +2/2 +local +[0-9]+s +- +-$" <<< "$terminal" ||
  fail "jobs on a terminal printed: $terminal"
terminal=$(script -qec "'$troupe' ls calc/" /dev/null | tr -d '\r')
grep -Eq "^NAME +ADDRESS +STATE +INCARNATION +AGE$" <<< "$terminal" ||
  fail "ls on a terminal printed: $terminal"
expect_status 2 "$troupe" jobs --slurm --watch
grep -q "^troupe jobs: --watch is for the resolver's jobs, not with --slurm$" <<< "$output" ||
  fail "$output"
mkfifo "$out/jobs.out"
"$troupe" jobs --watch > "$out/jobs.out" &
jobs_pid=$!
pids+=("$jobs_pid")
exec 7< "$out/jobs.out"
await_line 7 "calc running 2/2 local" > /dev/null

echo "== troupe logs: the replicas' output, relayed by the registry from the launcher"
expect_status 0 "$troupe" logs calc
grep -q '^\[0\] calculator serving at tls://.* as calc/calc-0$' <<< "$output" || fail "logs printed: $output"
grep -q '^\[1\] calculator serving at tls://.* as calc/calc-1$' <<< "$output" || fail "logs printed: $output"
expect_status 0 "$troupe" logs calc 1 --lines 2
[ "$(wc -l <<< "$output")" -eq 2 ] || fail "logs --lines 2 printed: $output"
[ "$(tail -1 <<< "$output")" = "$(tail -1 "$out/logs/calc/replica-1.log")" ] ||
  fail "logs calc 1 printed: $output"
expect_status 1 "$troupe" logs calc 2
grep -q "^troupe logs: job 'calc' has 2 replica(s), numbered from 0; not 2$" <<< "$output" ||
  fail "$output"
expect_status 1 "$troupe" logs nojob
grep -q "^troupe logs: the registry knows no job 'nojob'" <<< "$output" || fail "$output"

echo "== troupe stop: only with the job's token or the administrator's"
"$troupe" launch --name stopme --cpu 0.1 --log-dir "$out/logs" -- "$server" > "$out/stopme.out" 2>&1 &
stopme_pid=$!
pids+=("$stopme_pid")
expect_status 0 "$troupe" wait stopme/ --count 1 --timeout 20s
mkfifo "$out/follow.out"
"$troupe" logs stopme 0 --follow --lines 0 > "$out/follow.out" 2>&1 &
follow_pid=$!
pids+=("$follow_pid")
exec 8< "$out/follow.out"
expect_status 1 "$troupe" stop stopme
grep -q "^troupe stop: only the owner of job 'stopme' (its job token) or an administrator .* was not presented$" \
  <<< "$output" || fail "$output"
expect_status 1 env TROUPE_JOB_TOKEN_FILE="$out/logs/calc/job-token" "$troupe" stop stopme
grep -q "the credential presented is neither$" <<< "$output" || fail "$output"
expect_status 0 "$troupe" call stopme/calc-0 calc.add '{"a": 1, "b": 1}'
expect_status 0 "$troupe" stop stopme --grace 10s --job-token-file "$out/logs/stopme/job-token"
[ "$output" = "job stopme stopped" ] || fail "stop printed: $output"
# --follow ends once the launcher is gone, saying where the logs are.
await_line 8 "troupe logs: the launcher of job 'stopme' is gone; its logs are in " > /dev/null
wait "$follow_pid" || fail "troupe logs --follow did not end cleanly when the launcher went"
exec 8<&-
status=0
wait "$stopme_pid" || status=$?
[ "$status" -eq 1 ] || fail "troupe launch of a stopped job exited with $status"
grep -q "job stopme: stopped" "$out/stopme.out" || fail "$(cat "$out/stopme.out")"
expect_status 0 "$troupe" stop stopme
[ "$output" = "job 'stopme' has already ended: stopped: terminated" ] || fail "stop printed: $output"
expect_status 1 "$troupe" logs stopme
grep -q "^troupe logs: the launcher of job 'stopme' is gone; its logs are in .*:$out/logs/stopme$" \
  <<< "$output" || fail "$output"
"$troupe" launch --name adminstop --cpu 0.1 --log-dir "$out/logs" -- "$server" > /dev/null 2>&1 &
adminstop_pid=$!
pids+=("$adminstop_pid")
expect_status 0 "$troupe" wait adminstop/ --count 1 --timeout 20s
expect_status 0 "$troupe" stop adminstop --admin-token-file "$out/admin-token"
[ "$output" = "job adminstop stopped" ] || fail "stop printed: $output"
wait "$adminstop_pid" || true

echo "== Ctrl-C stops the launched job; watchers see it end"
mkfifo "$out/watch.out"
"$troupe" ls --watch calc/ > "$out/watch.out" &
watch_pid=$!
pids+=("$watch_pid")
exec 5< "$out/watch.out"
await_line 5 "SYNCED" > /dev/null
kill -INT "$launch_pid"
status=0
wait "$launch_pid" || status=$?
[ "$status" -eq 130 ] || fail "troupe launch exited with $status after SIGINT"
await_line 5 "REMOVED calc/calc-" > /dev/null
await_line 5 "JOB_ENDED calc stopped" > /dev/null
cat <&4 > "$out/launch.log"
grep -q "job calc: stopped" "$out/launch.log" || fail "$(cat "$out/launch.log")"
kill -TERM "$watch_pid"
wait "$watch_pid" || fail "troupe ls --watch did not stop cleanly on SIGTERM"
line=$(await_line 7 "calc stopped")
grep -q "^calc stopped 0/2 local [0-9]*s [0-9]*s " <<< "$line" || fail "jobs --watch printed: $line"
kill -INT "$jobs_pid"
wait "$jobs_pid" || fail "troupe jobs --watch did not stop cleanly on SIGINT"
exec 7<&-

echo "== troupe wait after the job ended fails at once, not at its timeout"
expect_status 1 "$troupe" wait calc/ --count 2 --timeout 1h
grep -q "^troupe wait: job 'calc' ended: stopped" <<< "$output" || fail "$output"
expect_status 1 "$troupe" wait calc --count 1 --timeout 1h
grep -q "^troupe wait: job 'calc' ended: stopped" <<< "$output" || fail "$output"

kill -TERM "$registry_pid"
status=0
wait "$registry_pid" || status=$?
[ "$status" -eq 0 ] || fail "registry exited with $status"
exec 3<&- 4<&- 5<&-

echo "== the token appears in no output and no log"
grep -q "refused a connection from 127.0.0.1:[0-9]*: a wrong cluster token" "$out/registry.err" ||
  fail "the registry did not log the refusal: $(cat "$out/registry.err")"
if grep -rqF "$token" "$out/registry.err" "$out/launch.log" "$out/logs"; then
  fail "the token was written out"
fi
echo "troupe cli test passed"
