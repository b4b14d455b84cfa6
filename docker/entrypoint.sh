#!/bin/sh
# Roles of the babysitter docker test cluster (all containers use host networking; ports in
# babysitter/devcluster/container.py). The slurmctld container writes the cluster config into
# the shared /cluster directory with `python -m babysitter.devcluster.container render`, the
# generator the devcluster uses; the other roles wait for it (compose orders them too).
set -eu

ROLE=${1:-}
CLUSTER=/cluster
SLURM_CONF=${SLURM_CONF:-$CLUSTER/etc/slurm.conf}
export SLURM_CONF
port() { python -c "from babysitter.devcluster.container import PORTS; print(PORTS['$1'])"; }

wait_for() {
    i=0
    while [ ! -e "$1" ]; do
        i=$((i + 1))
        if [ "$i" -gt 600 ]; then
            echo "timed out waiting for $1" >&2
            exit 1
        fi
        sleep 0.2
    done
}

start_munge() {
    wait_for "$CLUSTER/munge.key"
    install -d -m 0755 /run/munge
    # each container has its own munged at the default socket, all with the cluster's key
    munged --force --key-file="$CLUSTER/munge.key" --pid-file=/run/munge/munged.pid \
        --log-file=/run/munge/munged.log --seed-file=/run/munge/munged.seed
}

case "$ROLE" in
slurmctld)
    # a fresh cluster on every start: no state of an earlier run
    rm -rf "$CLUSTER/state" "$CLUSTER/spool" "$CLUSTER/etc/slurm.conf"
    mkdir -p "$CLUSTER/state" "$CLUSTER/log" "$CLUSTER/run" "$CLUSTER/spool" "$CLUSTER/dev"
    python -m babysitter.devcluster.container render "$CLUSTER"
    for i in 0 1 2 3 4 5 6 7; do
        # gres.conf needs character devices (like /dev/null) for the simulated GPUs
        [ -e "$CLUSTER/dev/nvidia$i" ] || mknod -m 0666 "$CLUSTER/dev/nvidia$i" c 1 3
    done
    start_munge
    exec slurmctld -D -f "$SLURM_CONF"
    ;;
node)
    NODE=${NODE_NAME:?NODE_NAME must be set}
    wait_for "$SLURM_CONF"
    start_munge
    D="/var/lib/babysitter/$NODE"
    mkdir -p "$CLUSTER/spool/$NODE" "$D/sysfs"
    # every (re)start of the container is a reboot of the node: a new boot id (the agent keeps
    # event findings such as XID 79 until the node reboots), healthy GPUs, empty kernel log
    cat /proc/sys/kernel/random/uuid >"$D/boot_id"
    : >"$D/kmsg"
    export FAKE_NVML_STATE="$D/nvml-state"
    python -c "from babysitter.devcluster.fakenvml import FakeGpus; from pathlib import Path; \
FakeGpus(Path('$FAKE_NVML_STATE'))"
    rm -f "$CLUSTER/run/slurmd-$NODE.pid"
    slurmd -f "$SLURM_CONF" -N "$NODE"  # daemonizes; the agent checks that it runs
    # simulated GPUs: the agent loads the fake libnvidia-ml through the real pynvml
    LD_LIBRARY_PATH=$(find /opt/fakenvml -mindepth 1 -maxdepth 1 -type d | head -n 1)
    export LD_LIBRARY_PATH
    export BABYSITTER_CONFIG="$CLUSTER/agent-$NODE.toml"
    exec babysitter agent
    ;;
controller)
    wait_for "$CLUSTER/controller.toml"
    start_munge
    export BABYSITTER_CONFIG="$CLUSTER/controller.toml"
    babysitter db upgrade
    exec babysitter controller
    ;;
postgres)
    PG_PORT=$(port postgres)
    PGDATA=/var/lib/postgresql/babysitter
    PGBIN=$(find /usr/lib/postgresql -mindepth 2 -maxdepth 2 -name bin | sort | tail -n 1)
    as_pg() { setpriv --reuid=postgres --regid=postgres --init-groups "$@"; }
    if [ ! -e "$PGDATA/PG_VERSION" ]; then
        install -d -o postgres -g postgres "$PGDATA"
        as_pg "$PGBIN/initdb" -A trust -U postgres -D "$PGDATA" >/dev/null
        as_pg "$PGBIN/pg_ctl" -s -w -D "$PGDATA" \
            -o "-p $PG_PORT -k /tmp -c listen_addresses=127.0.0.1" start
        as_pg "$PGBIN/createuser" -h 127.0.0.1 -p "$PG_PORT" -U postgres babysitter
        as_pg "$PGBIN/createdb" -h 127.0.0.1 -p "$PG_PORT" -U postgres -O babysitter babysitter
        as_pg "$PGBIN/pg_ctl" -s -w -D "$PGDATA" stop
    fi
    exec setpriv --reuid=postgres --regid=postgres --init-groups "$PGBIN/postgres" \
        -D "$PGDATA" -p "$PG_PORT" -k /tmp -c listen_addresses=127.0.0.1
    ;;
alertmanager)
    exec prometheus-alertmanager --config.file=/opt/babysitter/docker/alertmanager.yml \
        --storage.path=/tmp/alertmanager --web.listen-address="127.0.0.1:$(port alertmanager)" \
        --cluster.listen-address=
    ;;
*)
    echo "usage: entrypoint.sh slurmctld|node|controller|postgres|alertmanager" >&2
    exit 2
    ;;
esac
