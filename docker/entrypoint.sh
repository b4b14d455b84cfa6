#!/bin/sh
# Roles of the babysitter docker test cluster (all containers use host networking; ports in
# babysitter/devcluster/container.py). The slurmctld container writes the Slurm config and the
# site values into the shared /cluster directory with `python -m babysitter.devcluster.container
# render`, the generator the devcluster uses; the other roles wait for it (compose orders them
# too). babysitter itself is set up by docs/deploy.md's own steps (/opt/babysitter-guide/<step>.sh,
# made by docker/guide.py): this file only does what the guide leaves to a real cluster's tools
# (copying a file between hosts, systemd starting a unit) and the simulation (fake GPUs).
set -eu

ROLE=${1:-}
CLUSTER=/cluster
GUIDE=/opt/babysitter-guide
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

# The guide's site values (docs/deploy.md "Site values") for this cluster.
site_values() {
    wait_for "$CLUSTER/site.env"
    wait_for "$CLUSTER/db.password"
    set -a
    # shellcheck source=/dev/null
    . "$CLUSTER/site.env"
    set +a
    DB_PASSWORD=$(cat "$CLUSTER/db.password")
    export DB_PASSWORD
}

# A guide step, as the admin runs it on this host.
guide() {
    bash "$GUIDE/$1.sh"
}

# Settings of the simulated cluster beyond the guide's, in the units' EnvironmentFile (once).
add_env() {
    grep -qx '# docker test cluster' /etc/default/babysitter 2>/dev/null ||
        { echo '# docker test cluster'; cat "$1"; } >>/etc/default/babysitter
}

# What systemd does with an installed unit: its EnvironmentFile, ExecStartPre, then ExecStart
# (the containers have no systemd; the unit file the guide installed is the one read).
run_unit() {
    unit=/etc/systemd/system/$1.service
    [ -f "$unit" ] || { echo "unit $unit not installed" >&2; exit 1; }
    envfile=$(sed -n 's/^EnvironmentFile=-\{0,1\}//p' "$unit")
    if [ -n "$envfile" ] && [ -f "$envfile" ]; then
        set -a
        # shellcheck source=/dev/null
        . "$envfile"
        set +a
    fi
    sed -n 's/^ExecStartPre=//p' "$unit" | while IFS= read -r cmd; do sh -c "$cmd" || exit 1; done
    exec sh -c "exec $(sed -n 's/^ExecStart=//p' "$unit")"
}

case "$ROLE" in
slurmctld)
    # a fresh cluster on every start: no state of an earlier run
    # (and no babysitter secrets of one: the controller's guide steps make new ones)
    rm -rf "$CLUSTER/state" "$CLUSTER/spool" "$CLUSTER/etc/slurm.conf" "$CLUSTER/node-tokens" \
        "$CLUSTER/admin.token" "$CLUSTER/ca.pem"
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
    site_values
    start_munge
    D="/var/lib/babysitter/$NODE"
    mkdir -p "$CLUSTER/spool/$NODE" "$D/sysfs"
    # every (re)start of the container is a reboot of the node: a new boot id (the agent keeps
    # event findings such as XID 79 until the node reboots), healthy GPUs, empty kernel log
    cat /proc/sys/kernel/random/uuid >"$D/boot_id"
    : >"$D/kmsg"
    FAKE_NVML_STATE="$D/nvml-state"
    python -c "from babysitter.devcluster.fakenvml import FakeGpus; from pathlib import Path; \
FakeGpus(Path('$FAKE_NVML_STATE'))"
    rm -f "$CLUSTER/run/slurmd-$NODE.pid"
    slurmd -f "$SLURM_CONF" -N "$NODE"  # daemonizes; the agent checks that it runs
    # the guide's scp of the node's token and the CA from the controller host (it waited for
    # the controller to be healthy, so they are there)
    install -d -m 0755 /etc/babysitter
    install -m 0600 "$CLUSTER/node-tokens/$NODE.token" /etc/babysitter/node.token
    install -m 0644 "$CLUSTER/ca.pem" /etc/babysitter/ca.pem
    NODE_NAME=$NODE guide node
    # simulated GPUs: the agent loads the fake libnvidia-ml through the real pynvml
    LIB=$(find /opt/fakenvml -mindepth 1 -maxdepth 1 -type d | head -n 1)
    {
        cat "$CLUSTER/agent-$NODE.env"
        echo "FAKE_NVML_STATE=$FAKE_NVML_STATE"
        echo "LD_LIBRARY_PATH=$LIB"
    } >"/tmp/agent.env"
    add_env /tmp/agent.env
    run_unit babysitter-agent
    ;;
controller)
    wait_for "$SLURM_CONF"
    site_values
    start_munge
    guide controller
    guide enforce  # the test cluster skips the dry-run week
    add_env "$CLUSTER/controller.env"
    # the guide's copy of each node's token and the CA to the nodes; the admin token and the
    # CA for the tests
    install -d -m 0700 "$CLUSTER/node-tokens"
    cp -p /etc/babysitter/node-tokens/*.token "$CLUSTER/node-tokens/"
    install -m 0644 /etc/babysitter/ca.pem "$CLUSTER/ca.pem"
    install -m 0600 /etc/babysitter/admin.token "$CLUSTER/admin.token"
    run_unit babysitter-controller
    ;;
postgres)
    PG_PORT=$(port postgres)
    PGDATA=/var/lib/postgresql/babysitter
    PGBIN=$(find /usr/lib/postgresql -mindepth 2 -maxdepth 2 -name bin | sort | tail -n 1)
    as_pg() { setpriv --reuid=postgres --regid=postgres --init-groups "$@"; }
    if [ ! -e "$PGDATA/PG_VERSION" ]; then
        install -d -o postgres -g postgres "$PGDATA"
        # passwords over TCP, as on a real database host (the guide's role has one)
        as_pg "$PGBIN/initdb" --auth-local=peer --auth-host=scram-sha-256 -U postgres \
            -D "$PGDATA" >/dev/null
        as_pg "$PGBIN/pg_ctl" -s -w -D "$PGDATA" \
            -o "-p $PG_PORT -k /tmp -c listen_addresses=127.0.0.1" start
        # the database admin picks the password; the controller host gets it (see site_values)
        (umask 077; head -c 24 /dev/urandom | base64 | tr -d '/+=' >"$CLUSTER/db.password.new")
        mv "$CLUSTER/db.password.new" "$CLUSTER/db.password"
        DB_PASSWORD=$(cat "$CLUSTER/db.password") PGHOST=/tmp PGPORT=$PG_PORT guide db
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
