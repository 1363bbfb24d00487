#!/usr/bin/env bash
# Stop the test cluster started by tests/slurm/start_cluster.sh.
#
# Only processes recorded in $SLURM_TEST_DIR's pid files (and job step
# daemons holding files in its spool) are touched.  Idempotent: succeeds when
# nothing is running.  `--purge` also deletes $SLURM_TEST_DIR.
#
# start_cluster.sh creates no network namespaces (it uses multiple slurmds
# on 127.0.0.1), so there are none to remove; any namespace named
# "q3t-slurm-*" (reserved for that purpose) is removed anyway.
set -uo pipefail

DIR="${SLURM_TEST_DIR:-/tmp/q3t-slurm}"
case "$DIR" in /*) ;; *) DIR="$(pwd)/$DIR" ;; esac
PURGE=0
[[ ${1:-} == --purge ]] && PURGE=1
export PATH="$PATH:/usr/sbin:/sbin"

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

stop_pids() { # label pid...
    local label=$1
    shift
    (($#)) || return 0
    echo "stop_cluster: stopping $label (pid $*)"
    kill "$@" 2>/dev/null
    local i p alive
    for i in $(seq 100); do
        alive=()
        for p in "$@"; do kill -0 "$p" 2>/dev/null && alive+=("$p"); done
        ((${#alive[@]})) || return 0
        sleep 0.1
    done
    echo "stop_cluster: $label did not exit after 10s; SIGKILL ${alive[*]}"
    kill -9 "${alive[@]}" 2>/dev/null
    return 0
}

if [[ -d $DIR ]]; then
    # Cancel remaining jobs first so slurmstepd processes exit cleanly.
    if ctld=$(live_pid "$DIR/run/slurmctld.pid" slurmctld) && [[ -f $DIR/slurm.conf ]]; then
        if [[ -n $(SLURM_CONF="$DIR/slurm.conf" timeout 10 squeue -h -o %i 2>/dev/null) ]]; then
            echo "stop_cluster: cancelling remaining jobs"
            SLURM_CONF="$DIR/slurm.conf" timeout 10 scancel --full -u "$(id -un)" 2>/dev/null
            for _ in $(seq 50); do
                [[ -z $(SLURM_CONF="$DIR/slurm.conf" timeout 10 squeue -h -o %i 2>/dev/null) ]] && break
                sleep 0.2
            done
        fi
    fi

    pids=()
    for pf in "$DIR"/run/slurmd-*.pid; do
        p=$(live_pid "$pf" slurmd) && pids+=("$p")
    done
    stop_pids slurmd "${pids[@]}"

    # Job leftovers (only if jobs could not be cancelled, e.g. slurmctld was
    # already dead): slurmstepd processes holding files under $DIR (their
    # slurmd log), plus their job processes.  slurmstepd ignores SIGTERM.
    stepds=()
    for p in /proc/[0-9]*; do
        p=${p#/proc/}
        [[ $(cat "/proc/$p/comm" 2>/dev/null) == slurmstepd ]] || continue
        if ls -l "/proc/$p/fd" 2>/dev/null | grep -q -- "-> $DIR/"; then stepds+=("$p"); fi
    done
    if ((${#stepds[@]})); then
        # descendants of those slurmstepds (proctrack/linuxproc = process tree)
        tree=("${stepds[@]}")
        while :; do
            added=0
            for p in /proc/[0-9]*; do
                p=${p#/proc/}
                pp=$(awk '{sub(/.*\) /, ""); print $2}' "/proc/$p/stat" 2>/dev/null) || continue
                [[ " ${tree[*]} " == *" $pp "* && " ${tree[*]} " != *" $p "* ]] || continue
                tree+=("$p")
                added=1
            done
            ((added)) || break
        done
        jobs_=("${tree[@]:${#stepds[@]}}")
        if ((${#jobs_[@]})); then
            echo "stop_cluster: terminating leftover job processes (pid ${jobs_[*]})"
            kill "${jobs_[@]}" 2>/dev/null
            sleep 1
        fi
        echo "stop_cluster: killing leftover slurmstepd (pid ${stepds[*]})"
        kill -9 "${tree[@]}" 2>/dev/null
    fi

    pids=()
    p=$(live_pid "$DIR/run/slurmctld.pid" slurmctld) && pids+=("$p")
    stop_pids slurmctld "${pids[@]}"

    pids=()
    p=$(live_pid "$DIR/munge/munged.pid" munged) && pids+=("$p")
    stop_pids munged "${pids[@]}"

    rm -f "$DIR"/run/*.pid "$DIR/munge/munged.pid" "$DIR/munge/munge.socket" "$DIR/munge/munge.socket.lock"
fi

if command -v ip >/dev/null 2>&1; then
    for ns in $(ip netns list 2>/dev/null | awk '$1 ~ /^q3t-slurm-/ {print $1}'); do
        echo "stop_cluster: deleting network namespace $ns"
        ip netns delete "$ns" 2>/dev/null
    done
fi

if ((PURGE)) && [[ -d $DIR && $DIR != / && -f $DIR/slurm.conf ]]; then
    echo "stop_cluster: removing $DIR"
    rm -rf "$DIR"
fi
echo "stop_cluster: stopped"
exit 0
