#!/usr/bin/env bash
# `troupe launch --launcher slurm` end to end, on the one-node Slurm cluster of
# scripts/slurm-local.sh (SLURM_CONF names it): a registry (troupe registry on loopback), the
# calculator example as a Slurm job of three tasks, troupe wait, troupe jobs (the registry's and
# Slurm's), troupe call and logs against them, troupe stop of a second job, usage errors, then
# Ctrl-C (SIGTERM) stopping the job: Slurm cancels it and the registry ends it. Every process
# started here is stopped by its own pid, and the Slurm job is cancelled, also when the script
# fails.
#
#   troupe_slurm_test.sh TROUPE CALCULATOR_SERVER
set -euo pipefail
troupe=$1
server=$2
[ -n "${SLURM_CONF:-}" ] || { echo "FAILED: SLURM_CONF is not set" >&2; exit 1; }
source "$(dirname "$0")/cli_lib.sh"
cancel_job() { scancel --name=calc-slurm 2>/dev/null; }
cleanup_extra=cancel_job
AWAIT_SECONDS=60  # Slurm schedules, and its tasks start, in its own time

echo "== troupe registry"
mkfifo "$out/registry.out"
"$troupe" registry --listen tcp://127.0.0.1:0 --log-level warn > "$out/registry.out" \
  2> "$out/registry.err" &
registry_pid=$!
pids+=("$registry_pid")
exec 3< "$out/registry.out"
line=$(await_line 3 "LISTENING tcp://")
export TROUPE_RESOLVER="registry://${line#LISTENING tcp://}"

echo "== usage errors"
expect_status 2 env -u TROUPE_RESOLVER "$troupe" launch --launcher slurm -- "$server"
grep -q "needs --resolver URL (or TROUPE_RESOLVER)" <<< "$output" || fail "$output"
expect_status 2 "$troupe" launch --partition debug -- "$server"
grep -q "are for --launcher slurm" <<< "$output" || fail "$output"
expect_status 2 "$troupe" launch --launcher pbs -- "$server"
grep -q "is local or slurm, not 'pbs'" <<< "$output" || fail "$output"

echo "== a partition that does not exist: unschedulable at once"
expect_status 1 "$troupe" launch --launcher slurm --partition nowhere --name calc-nowhere \
  --log-dir "$out/logs" -- "$server"
grep -q "job calc-nowhere: unschedulable: sbatch .*invalid partition" <<< "$output" ||
  fail "$output"

echo "== troupe launch --launcher slurm: job calc-slurm, 3 tasks"
mkfifo "$out/launch.out"
"$troupe" launch --launcher slurm --partition debug --time 10m --name calc-slurm --replicas 3 \
  --cpu 1 --ram 64m --log-dir "$out/logs" -- "$server" > "$out/launch.out" 2>&1 &
launch_pid=$!
pids+=("$launch_pid")
exec 4< "$out/launch.out"
await_line 4 "job calc-slurm: running" > /dev/null
expect_status 0 "$troupe" wait calc-slurm/ --count 3 --timeout 30s
[ "$output" = $'calc-slurm/calc-0\ncalc-slurm/calc-1\ncalc-slurm/calc-2' ] ||
  fail "wait printed: $output"
jobid=$(squeue --noheader --name=calc-slurm --format=%i)
[ -n "$jobid" ] || fail "squeue shows no job calc-slurm"
[ "$(squeue --noheader --jobs="$jobid" --format=%D:%C)" = "1:3" ] ||
  fail "job $jobid does not hold 3 cores: $(squeue --jobs="$jobid")"

echo "== troupe jobs shows it as Slurm does"
expect_status 0 "$troupe" jobs --slurm
grep -Eq "^calc-slurm +$jobid +RUNNING +3 +0 " <<< "$output" || fail "troupe jobs printed: $output"
grep -Eq "^calc-nowhere " <<< "$output" && fail "an unschedulable job, never submitted, is listed"
echo "== troupe jobs shows it as the registry does, with its launcher"
expect_status 0 "$troupe" jobs
grep -Eq "^calc-slurm running 3/3 slurm [0-9]+s - -$" <<< "$output" || fail "troupe jobs printed: $output"
grep -Eq "^calc-nowhere unschedulable 0/[0-9]+ slurm " <<< "$output" ||
  fail "troupe jobs printed: $output"

echo "== troupe call reaches the replicas"
expect_status 0 "$troupe" call calc-slurm/calc-2 calc.add '{"a": 1.5, "b": 2}'
[ "$output" = '{"value":3.5}' ] || fail "call printed: $output"
expect_status 0 "$troupe" call calc-slurm/ calc.sum '{"values": [1, 2, 3]}' --all
[ "$(grep -c '^calc-slurm/calc-[012] {"value":6}$' <<< "$output")" -eq 3 ] ||
  fail "call --all printed: $output"

echo "== troupe logs reads a Slurm replica's output through the registry"
expect_status 0 "$troupe" logs calc-slurm 2 --lines 20
grep -q "^calculator serving at .* as calc-slurm/calc-2$" <<< "$output" || fail "logs printed: $output"
expect_status 0 "$troupe" logs calc-slurm
[ "$(grep -c '^\[[012]\] calculator serving at ' <<< "$output")" -eq 3 ] || fail "logs printed: $output"

echo "== troupe stop ends a Slurm job through its launcher"
"$troupe" launch --launcher slurm --partition debug --time 10m --name stop-slurm --cpu 1 \
  --ram 64m --log-dir "$out/logs" -- "$server" > "$out/stop-slurm.out" 2>&1 &
stop_pid=$!
pids+=("$stop_pid")
expect_status 0 "$troupe" wait stop-slurm/ --count 1 --timeout 30s
stop_jobid=$(squeue --noheader --name=stop-slurm --format=%i)
expect_status 1 "$troupe" stop stop-slurm
grep -q "PERMISSION_DENIED\|only the owner of job 'stop-slurm'" <<< "$output" || fail "$output"
expect_status 0 "$troupe" stop stop-slurm --job-token-file "$out/logs/stop-slurm/job-token"
[ "$output" = "job stop-slurm stopped" ] || fail "stop printed: $output"
wait "$stop_pid" || true
state=$(scontrol -o show job "$stop_jobid" | sed -n 's/.* JobState=\([A-Z_]*\) .*/\1/p')
case $state in COMPLETED | CANCELLED) ;; *) fail "Slurm job $stop_jobid is $state" ;; esac

echo "== SIGTERM stops the job: cancelled in Slurm, ended in the registry"
kill -TERM "$launch_pid"
status=0
wait "$launch_pid" || status=$?
exec 4<&-
[ "$status" -eq 143 ] || fail "troupe launch exited with $status, not 143"
state=$(scontrol -o show job "$jobid" | sed -n 's/.* JobState=\([A-Z_]*\) .*/\1/p')
case $state in COMPLETED | CANCELLED) ;; *) fail "Slurm job $jobid is $state" ;; esac
expect_status 0 "$troupe" jobs --slurm
grep -Eq "^calc-slurm +$jobid +(COMPLETED|CANCELLED) " <<< "$output" ||
  fail "troupe jobs printed: $output"
expect_status 1 "$troupe" wait calc-slurm/ --count 1 --timeout 1h
grep -q "^troupe wait: job 'calc-slurm' ended: stopped" <<< "$output" || fail "$output"

kill -TERM "$registry_pid"
wait "$registry_pid" || fail "the registry did not stop cleanly on SIGTERM"
exec 3<&-
echo "troupe slurm test passed"
