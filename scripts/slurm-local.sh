#!/usr/bin/env bash
# A one-node Slurm cluster on this machine, for troupe's Slurm tests and for trying the Slurm
# launcher without a cluster: munged, slurmctld and slurmd (Debian's munge and slurm-wlm, which
# scripts/setup.sh installs), each with its own socket, ports, state and logs under DIR, on
# loopback, with no systemd and nothing under /etc touched.
#
#   scripts/slurm-local.sh start DIR   starts the three daemons and returns once the node is idle;
#                                      prints the line to use it: export SLURM_CONF=DIR/slurm.conf
#   scripts/slurm-local.sh stop DIR    stops them by the pids in DIR (SIGTERM, SIGKILL after 10 s)
#   scripts/slurm-local.sh restart-controller DIR
#                                      stops slurmctld and starts it again on its saved state, as
#                                      an administrator's restart does; returns once the node is back
#   scripts/slurm-local.sh stop-controller DIR / start-controller DIR
#                                      the two halves of that, for a controller that is down a while
#
# The node offers SLURM_LOCAL_CPUS cores (default 8, whatever the machine has) and the memory
# slurmd finds; one partition, "debug", holds it.
#
# The daemons run as root (slurmd starts every job's tasks), through sudo when this is not
# root. Slurm's commands (sbatch, squeue, scontrol, scancel) reach this cluster when
# SLURM_CONF names its slurm.conf.
set -euo pipefail

usage() {
  echo "usage: $0 start|stop|restart-controller|stop-controller|start-controller DIR" >&2
  exit 2
}
[ $# -eq 2 ] || usage
command=$1
dir=$2
case "$dir" in /*) ;; *) dir="$PWD/$dir" ;; esac

if [ "$(id -u)" -eq 0 ]; then
  as_root=()
else
  as_root=(sudo)
fi

# The pid in FILE, if FILE holds one of a running process.
running_pid() {
  local pid
  [ -s "$1" ] || return 1
  pid=$(tr -dc '0-9' < "$1")
  [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null && echo "$pid"
}

stop_pid_file() {  # stop_pid_file FILE NAME
  local pid i
  pid=$(running_pid "$1") || return 0
  "${as_root[@]}" kill -TERM "$pid" 2>/dev/null || true
  for ((i = 0; i < 100; i++)); do
    kill -0 "$pid" 2>/dev/null || return 0
    sleep 0.1
  done
  echo "slurm-local: $2 ($pid) did not stop on SIGTERM within 10 s; killing it" >&2
  "${as_root[@]}" kill -KILL "$pid" 2>/dev/null || true
}

stop() {
  stop_pid_file "$dir/slurmd.pid" slurmd
  stop_pid_file "$dir/slurmctld.pid" slurmctld
  stop_pid_file "$dir/munge/munged.pid" munged
}

# Whether TCP port $1 is free on this machine (no socket bound to it, in any state).
port_free() {
  local hex
  hex=$(printf ':%04X ' "$1")
  ! cat /proc/net/tcp /proc/net/tcp6 2>/dev/null | awk '{print $2" "}' | grep -q "$hex"
}

# Two free ports next to each other, picked at random above the ephemeral range's usual start.
free_port_pair() {
  local p i
  for ((i = 0; i < 200; i++)); do
    p=$((20000 + RANDOM % 12000 * 2))
    if port_free "$p" && port_free $((p + 1)); then
      echo "$p"
      return 0
    fi
  done
  echo "slurm-local: no two free TCP ports found" >&2
  return 1
}

# Prints the last lines of the daemons' logs, for an error message.
show_logs() {
  local f
  for f in "$dir/log/slurmctld.log" "$dir/log/slurmd.log" "$dir/munge/munged.log"; do
    [ -f "$f" ] || continue
    echo "--- last lines of $f" >&2
    tail -n 15 "$f" >&2
  done
}

write_conf() {  # write_conf PORT
  local host node cpus memory
  host=$(hostname -s)
  # What slurmd finds on this machine; declaring more memory than it reports drains the node.
  node=$(slurmd -C | head -n 1)
  cpus=$(sed -n 's/.* CPUs=\([0-9]*\).*/\1/p' <<< "$node")
  memory=$(sed -n 's/.* RealMemory=\([0-9]*\).*/\1/p' <<< "$node")
  # The node offers SLURM_LOCAL_CPUS cores (default 8) whatever the machine has, so that jobs
  # of several replicas fit a small machine (config_overrides: slurmd takes the configured
  # count rather than draining the node for claiming more than it found).
  cpus=${SLURM_LOCAL_CPUS:-${cpus:+8}}
  [ -n "$cpus" ] && [ -n "$memory" ] || {
    echo "slurm-local: cannot read CPUs and RealMemory from 'slurmd -C': $node" >&2
    return 1
  }
  cat > "$dir/slurm.conf" <<EOF
# A one-node cluster made by scripts/slurm-local.sh; everything it keeps is under $dir.
ClusterName=troupelocal
SlurmctldHost=$host(127.0.0.1)
SlurmUser=root
SlurmdUser=root
SlurmctldPort=$1
SlurmdPort=$(($1 + 1))
AuthType=auth/munge
AuthInfo=socket=$dir/munge/munge.socket
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
ProctrackType=proctrack/pgid
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
ReturnToService=2
MpiDefault=none
SwitchType=switch/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MinJobAge=300
KillWait=2
SlurmdParameters=config_overrides
NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$memory State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
EOF
}

start_munge() {
  mkdir -p "$dir/munge" "$dir/munge-key"
  chmod 755 "$dir/munge"  # its socket is for every user
  chmod 700 "$dir/munge-key"
  if [ ! -s "$dir/munge-key/munge.key" ]; then
    (umask 077 && head -c 1024 /dev/urandom > "$dir/munge-key/munge.key")
  fi
  chmod 400 "$dir/munge-key/munge.key"
  "${as_root[@]}" munged --force --socket="$dir/munge/munge.socket" \
    --key-file="$dir/munge-key/munge.key" --pid-file="$dir/munge/munged.pid" \
    --log-file="$dir/munge/munged.log" --seed-file="$dir/munge-key/munged.seed"
  munge -S "$dir/munge/munge.socket" -n | unmunge -S "$dir/munge/munge.socket" > /dev/null || {
    echo "slurm-local: munged started but does not decode its own credential" >&2
    return 1
  }
}

# Waits until the node is idle (slurmd registered with slurmctld), 30 s at most.
await_idle() {
  local state i
  for ((i = 0; i < 300; i++)); do
    state=$(SLURM_CONF="$dir/slurm.conf" sinfo --noheader --format=%t 2>/dev/null || true)
    [ "$state" = idle ] && return 0
    if ! running_pid "$dir/slurmctld.pid" > /dev/null || ! running_pid "$dir/slurmd.pid" > /dev/null; then
      [ $i -gt 20 ] && break  # give their pid files a moment to appear
    fi
    sleep 0.1
  done
  echo "slurm-local: the node did not become idle within 30 s (sinfo: '${state:-nothing}')" >&2
  return 1
}

start() {
  for tool in munged munge slurmctld slurmd sinfo; do
    command -v "$tool" > /dev/null || {
      echo "slurm-local: $tool not found (scripts/setup.sh installs munge and slurm-wlm)" >&2
      exit 1
    }
  done
  if running_pid "$dir/slurmctld.pid" > /dev/null; then
    echo "slurm-local: a cluster runs in $dir already; stop it first" >&2
    exit 1
  fi
  stop  # whatever a crashed start left
  rm -rf "$dir/state" "$dir/spool" "$dir/log"
  mkdir -p "$dir/state" "$dir/spool" "$dir/log"
  start_munge
  local attempt port
  for attempt in 1 2 3; do
    port=$(free_port_pair)
    write_conf "$port"
    : > "$dir/log/slurmctld.log"
    "${as_root[@]}" slurmctld -f "$dir/slurm.conf"
    "${as_root[@]}" slurmd -f "$dir/slurm.conf"
    if await_idle; then
      echo "slurm-local: one node ($(hostname -s)) idle; slurmctld on 127.0.0.1:$port"
      echo "export SLURM_CONF=$dir/slurm.conf"
      return 0
    fi
    # Another process may have taken a port between the check and the bind: try others.
    if grep -q "Address already in use" "$dir"/log/*.log 2>/dev/null && [ $attempt -lt 3 ]; then
      stop_pid_file "$dir/slurmd.pid" slurmd
      stop_pid_file "$dir/slurmctld.pid" slurmctld
      continue
    fi
    break
  done
  show_logs
  stop
  exit 1
}

stop_controller() {
  running_pid "$dir/slurmctld.pid" > /dev/null || {
    echo "slurm-local: no slurmctld runs in $dir" >&2
    exit 1
  }
  stop_pid_file "$dir/slurmctld.pid" slurmctld
}

start_controller() {
  if running_pid "$dir/slurmctld.pid" > /dev/null; then
    echo "slurm-local: slurmctld runs in $dir already" >&2
    exit 1
  fi
  [ -f "$dir/slurm.conf" ] || {
    echo "slurm-local: no cluster was started in $dir" >&2
    exit 1
  }
  "${as_root[@]}" slurmctld -f "$dir/slurm.conf"
  # Until slurmd registers again the node's state is unknown ("unk") and sbatch refuses jobs.
  local i state
  for ((i = 0; i < 300; i++)); do
    state=$(SLURM_CONF="$dir/slurm.conf" sinfo --noheader --format=%t 2>/dev/null || true)
    case "$state" in idle | mix | alloc | comp) return 0 ;; esac
    sleep 0.1
  done
  echo "slurm-local: the node did not register with slurmctld within 30 s of its start" \
    "(sinfo: '${state:-nothing}')" >&2
  show_logs
  exit 1
}

case "$command" in
  start) start ;;
  stop) stop ;;
  stop-controller) stop_controller ;;
  start-controller) start_controller ;;
  restart-controller) stop_controller && start_controller ;;
  *) usage ;;
esac
