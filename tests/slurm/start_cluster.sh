#!/usr/bin/env bash
# Start a throwaway Slurm cluster on this machine for tests.
#
# Everything (config, munge key/socket, daemon state, logs, pid files) lives
# under $SLURM_TEST_DIR (default /tmp/q3t-slurm).  Idempotent: running it
# while the cluster is up only checks that it is healthy.
#
# Two nodes by default ("node1", "node2"), each a separate slurmd on this
# machine, using Slurm's multiple-slurmd support (Debian's slurmd is built
# with --enable-multiple-slurmd: `scontrol show config` prints
# MULTIPLE_SLURMD = Yes).  All daemons listen on 127.0.0.1 only.
#
# Environment knobs:
#   SLURM_TEST_DIR          state directory            (/tmp/q3t-slurm)
#   SLURM_TEST_NODES        number of nodes, 1..8      (2)
#   SLURM_TEST_CTLD_PORT    slurmctld port             (6817)
#   SLURM_TEST_SLURMD_PORT  first slurmd port; node i uses PORT+i-1  (6818)
#   SLURM_TEST_CPUS         CPUs declared per node     ($(nproc))
#   SLURM_TEST_TIMEOUT      seconds to wait for idle   (60)
#
# Afterwards:  export SLURM_CONF=$SLURM_TEST_DIR/slurm.conf
set -euo pipefail

DIR="${SLURM_TEST_DIR:-/tmp/q3t-slurm}"
NNODES="${SLURM_TEST_NODES:-2}"
CTLD_PORT="${SLURM_TEST_CTLD_PORT:-6817}"
SLURMD_PORT="${SLURM_TEST_SLURMD_PORT:-6818}"
CPUS="${SLURM_TEST_CPUS:-$(nproc)}"
TIMEOUT="${SLURM_TEST_TIMEOUT:-60}"

case "$DIR" in /*) ;; *) DIR="$(pwd)/$DIR" ;; esac
if ! [[ "$NNODES" =~ ^[1-8]$ ]]; then
    echo "start_cluster: SLURM_TEST_NODES must be 1..8, got '$NNODES'" >&2
    exit 2
fi

export PATH="$PATH:/usr/sbin:/sbin"
T0=$(date +%s.%N)
log() { echo "start_cluster: $*"; }

# --------------------------------------------------------------------------
# 1. packages
# --------------------------------------------------------------------------
need=()
command -v slurmctld >/dev/null 2>&1 || need+=(slurmctld)
command -v slurmd >/dev/null 2>&1 || need+=(slurmd)
command -v sbatch >/dev/null 2>&1 || need+=(slurm-client)
command -v munged >/dev/null 2>&1 || need+=(munge)
if ((${#need[@]})); then
    log "installing ${need[*]} (apt-get)"
    if [[ $(id -u) -ne 0 ]]; then
        echo "start_cluster: need root to apt-get install ${need[*]}" >&2
        exit 1
    fi
    # Keep the packages' own init scripts from starting system-wide daemons.
    export DEBIAN_FRONTEND=noninteractive
    policy=/usr/sbin/policy-rc.d
    made_policy=0
    if [[ ! -e $policy ]]; then
        printf '#!/bin/sh\nexit 101\n' >"$policy"
        chmod 755 "$policy"
        made_policy=1
    fi
    rc=0
    apt-get install -y --no-install-recommends "${need[@]}" >"/tmp/q3t-slurm-apt.log" 2>&1 || rc=$?
    if ((rc)); then  # a fresh machine has no package lists yet
        rc=0
        { apt-get update && apt-get install -y --no-install-recommends "${need[@]}"; } >>"/tmp/q3t-slurm-apt.log" 2>&1 || rc=$?
    fi
    ((made_policy)) && rm -f "$policy"
    if ((rc)); then
        tail -n 30 /tmp/q3t-slurm-apt.log >&2
        echo "start_cluster: apt-get install failed (rc=$rc); is 'apt-get update' done?" >&2
        exit 1
    fi
fi

# --------------------------------------------------------------------------
# 2. layout + helpers
# --------------------------------------------------------------------------
CONF="$DIR/slurm.conf"
MDIR="$DIR/munge"
SOCK="$MDIR/munge.socket"
NODES=()
for ((i = 1; i <= NNODES; i++)); do NODES+=("node$i"); done
if ((NNODES == 1)); then NODESPEC=node1; else NODESPEC="node[1-$NNODES]"; fi

# munged insists that the socket's directory and its parents are not
# writable by others (sticky /tmp is fine) and are searchable by everyone.
mkdir -p "$DIR" "$MDIR" "$DIR/state" "$DIR/log" "$DIR/run" "$DIR/bin"
chmod 755 "$DIR" "$MDIR"
for n in "${NODES[@]}"; do mkdir -p "$DIR/spool/$n"; done

# pid from a pid file, only if that process is alive and is the expected
# program started on our files (guards against stale files / reused pids).
live_pid() { # pidfile progname
    local pf=$1 prog=$2 pid cmd
    [[ -s $pf ]] || return 1
    pid=$(<"$pf")
    [[ $pid =~ ^[0-9]+$ ]] || return 1
    [[ -r /proc/$pid/cmdline ]] || return 1
    cmd=$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null) || return 1
    [[ $cmd == *"$prog"* && $cmd == *"$DIR"* ]] || return 1
    echo "$pid"
}

dump_logs() {
    echo "----- start_cluster FAILED; daemon logs (tails) -----" >&2
    for f in "$MDIR/munged.log" "$DIR/log/slurmctld.log" "$DIR"/log/slurmd-*.log "$DIR"/log/*.out; do
        [[ -f $f ]] || continue
        echo "===== $f" >&2
        tail -n 25 "$f" >&2
    done
    echo "----- (cluster state left in $DIR; stop with tests/slurm/stop_cluster.sh) -----" >&2
}
fail() {
    echo "start_cluster: ERROR: $*" >&2
    dump_logs
    exit 1
}

# --------------------------------------------------------------------------
# 3. munge
# --------------------------------------------------------------------------
KEY="$MDIR/munge.key"
if [[ ! -s $KEY ]]; then
    rm -f "$KEY"
    if command -v mungekey >/dev/null 2>&1; then
        mungekey --create --keyfile="$KEY" >/dev/null
    else
        dd if=/dev/urandom of="$KEY" bs=1 count=1024 status=none
    fi
fi
chown "$(id -u):$(id -g)" "$KEY"
chmod 400 "$KEY"

if ! live_pid "$MDIR/munged.pid" munged >/dev/null; then
    rm -f "$SOCK" "$SOCK.lock"
    # munged runs as the invoking user (root here); it does not need --force.
    munged --socket="$SOCK" --key-file="$KEY" \
        --pid-file="$MDIR/munged.pid" --log-file="$MDIR/munged.log" \
        --seed-file="$MDIR/munged.seed" </dev/null >>"$DIR/log/munged.out" 2>&1 ||
        fail "munged did not start"
fi
for _ in $(seq 50); do [[ -S $SOCK ]] && break; sleep 0.1; done
munge -S "$SOCK" -n 2>/dev/null | unmunge -S "$SOCK" >/dev/null 2>&1 ||
    fail "munge credential round trip failed on $SOCK"

# --------------------------------------------------------------------------
# 4. slurm.conf
# --------------------------------------------------------------------------
HOST=$(hostname -s)
MEM_MB=$(awk '/^MemTotal:/ {print int($2/1024)}' /proc/meminfo)
# Every slurmd sees the whole machine; split ~90% of RAM between the nodes so
# that the declared RealMemory is below what each slurmd reports.
NODE_MEM=$((MEM_MB * 9 / 10 / NNODES))

NEWCONF=$(mktemp "$DIR/slurm.conf.XXXXXX")
{
    cat <<EOF
# Generated by tests/slurm/start_cluster.sh -- do not edit, it is rewritten.
ClusterName=q3t
SlurmctldHost=$HOST(127.0.0.1)
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$SOCK
# bind to the resolved address (127.0.0.1) instead of INADDR_ANY
CommunicationParameters=NoCtldInAddrAny,NoInAddrAny
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool/%n
SlurmctldPidFile=$DIR/run/slurmctld.pid
SlurmdPidFile=$DIR/run/slurmd-%n.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
# containers: no cgroups, no systemd
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
# start batch jobs at submit time instead of on the next scheduler pass (~3 s)
SchedulerParameters=batch_sched_delay=0
ReturnToService=2
SlurmdTimeout=60
InactiveLimit=0
KillWait=5
MinJobAge=600
# No slurmdbd: plain sacct fails ("Slurm accounting storage is disabled").
# Finished jobs are logged by jobcomp/filetxt, readable by "sacct -c"
# (see $DIR/bin/sacct).
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/filetxt
JobCompLoc=$DIR/log/jobcomp.txt
EOF
    for ((i = 1; i <= NNODES; i++)); do
        echo "NodeName=node$i NodeHostname=$HOST NodeAddr=127.0.0.1 Port=$((SLURMD_PORT + i - 1)) CPUs=$CPUS RealMemory=$NODE_MEM State=UNKNOWN"
    done
    echo "PartitionName=debug Nodes=$NODESPEC Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO"
} >"$NEWCONF"

conf_changed=0
if [[ -f $CONF ]] && cmp -s "$NEWCONF" "$CONF"; then
    rm -f "$NEWCONF"
else
    [[ -f $CONF ]] && conf_changed=1
    mv -f "$NEWCONF" "$CONF"
    chmod 644 "$CONF"
fi
export SLURM_CONF="$CONF"

# sacct shim: the real sacct with -c (read the jobcomp file), so that tools
# that poll "sacct" (submitit) get COMPLETED/FAILED/... for finished jobs.
cat >"$DIR/bin/sacct" <<EOF
#!/bin/sh
# Generated by tests/slurm/start_cluster.sh: no slurmdbd in the test cluster,
# so answer from the jobcomp/filetxt log ($DIR/log/jobcomp.txt).
# Only finished jobs appear there; running/pending jobs are simply absent.
: "\${SLURM_CONF:=$CONF}"
export SLURM_CONF
exec /usr/bin/sacct -c "\$@"
EOF
chmod 755 "$DIR/bin/sacct"

# --------------------------------------------------------------------------
# 5. slurm daemons
# --------------------------------------------------------------------------
stop_slurm_daemons() { # used only when the config changed under running daemons
    local pids=() p pf
    for pf in "$DIR"/run/slurmd-*.pid; do
        p=$(live_pid "$pf" slurmd) && pids+=("$p")
    done
    p=$(live_pid "$DIR/run/slurmctld.pid" slurmctld) && pids+=("$p")
    ((${#pids[@]})) || return 0
    kill "${pids[@]}" 2>/dev/null || true
    for _ in $(seq 100); do
        local alive=0
        for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
        ((alive)) || return 0
        sleep 0.1
    done
    kill -9 "${pids[@]}" 2>/dev/null || true
}
if ((conf_changed)); then
    log "slurm.conf changed; restarting slurm daemons"
    stop_slurm_daemons
fi

# slurmd processes for nodes that are no longer configured
for pf in "$DIR"/run/slurmd-*.pid; do
    [[ -e $pf ]] || continue
    n=${pf##*/slurmd-}
    n=${n%.pid}
    keep=0
    for m in "${NODES[@]}"; do [[ $m == "$n" ]] && keep=1; done
    if ((!keep)); then
        p=$(live_pid "$pf" slurmd) && kill "$p" 2>/dev/null || true
        rm -f "$pf"
    fi
done

started_ctld=0
if ! live_pid "$DIR/run/slurmctld.pid" slurmctld >/dev/null; then
    slurmctld -f "$CONF" </dev/null >>"$DIR/log/slurmctld.out" 2>&1 ||
        fail "slurmctld did not start"
    started_ctld=1
fi
for n in "${NODES[@]}"; do
    if ! live_pid "$DIR/run/slurmd-$n.pid" slurmd >/dev/null; then
        slurmd -f "$CONF" -N "$n" </dev/null >>"$DIR/log/slurmd-$n.out" 2>&1 ||
            fail "slurmd -N $n did not start"
    fi
done

# A freshly started slurmctld recovers jobs from $DIR/state (job ids keep
# counting up across restarts, on purpose: submitit names its files by job
# id).  Jobs still listed then are leftovers of a cluster that was not
# stopped with stop_cluster.sh (which cancels everything): cancel them.
if ((started_ctld)); then
    for _ in $(seq 50); do scontrol ping >/dev/null 2>&1 && break; sleep 0.1; done
    stale=$(squeue -h -o %i 2>/dev/null | tr '\n' ' ' || true)
    if [[ -n ${stale// /} ]]; then
        log "cancelling jobs left over from a previous run: $stale"
        # shellcheck disable=SC2086
        scancel --full $stale 2>/dev/null || true
    fi
fi

# --------------------------------------------------------------------------
# 6. wait until every node is idle (or allocated/mixed: jobs may be running)
# --------------------------------------------------------------------------
deadline=$(($(date +%s) + TIMEOUT))
ok=0
while (($(date +%s) < deadline)); do
    states=$(sinfo -h -N -p debug -o '%N %T' 2>/dev/null || true)
    nready=$(awk '$2 ~ /^(idle|mixed|allocated|completing)$/' <<<"$states" | wc -l)
    if ((nready == NNODES)); then
        ok=1
        break
    fi
    # a node that came back DOWN after a restart (e.g. unexpected reboot)
    for n in $(awk '$2 ~ /down|drain|fail/ {print $1}' <<<"$states"); do
        scontrol update NodeName="$n" State=RESUME >/dev/null 2>&1 || true
    done
    sleep 0.5
done
if ((!ok)); then
    echo "sinfo:" >&2
    sinfo -N -l >&2 || true
    fail "nodes not idle after ${TIMEOUT}s"
fi

T1=$(date +%s.%N)
log "cluster up: ${NNODES} node(s) ($NODESPEC, ${CPUS} CPUs each) on $HOST/127.0.0.1, ctld port $CTLD_PORT, in $(awk -v a="$T0" -v b="$T1" 'BEGIN {printf "%.1f", b - a}')s"
sinfo
echo
echo "export SLURM_CONF=$CONF"
echo "# optional, for tools that poll sacct (submitit): export PATH=$DIR/bin:\$PATH"
