#!/bin/sh
# Roles of the babysitter docker test cluster. Config comes from
# `python -m babysitter.devcluster.container render /cluster` - the same generator the
# devcluster uses - written once by the slurmctld container into the shared /cluster volume.
set -eu

ROLE=${1:-}
CLUSTER=/cluster
export SLURM_CONF="$CLUSTER/etc/slurm.conf"

wait_for() {
    i=0
    while [ ! -e "$1" ]; do
        i=$((i + 1))
        if [ "$i" -gt 120 ]; then
            echo "timed out waiting for $1" >&2
            exit 1
        fi
        sleep 1
    done
}

start_munge() {
    wait_for "$CLUSTER/munge.key"
    install -d -m 0755 /run/munge
    cp "$CLUSTER/munge.key" /etc/munge/munge.key
    chmod 0400 /etc/munge/munge.key
    munged --force
}

case "$ROLE" in
slurmctld)
    python -m babysitter.devcluster.container render "$CLUSTER"
    mkdir -p "$CLUSTER/state" "$CLUSTER/log" "$CLUSTER/run" "$CLUSTER/spool" "$CLUSTER/dev"
    start_munge
    exec slurmctld -D -f "$SLURM_CONF"
    ;;
node)
    NODE=${NODE_NAME:?NODE_NAME must be set}
    wait_for "$SLURM_CONF"
    start_munge
    mkdir -p "$CLUSTER/spool/$NODE" "/var/lib/babysitter/$NODE" "$CLUSTER/dev"
    for i in 0 1 2 3 4 5 6 7; do
        [ -e "$CLUSTER/dev/nvidia$i" ] || mknod "$CLUSTER/dev/nvidia$i" c 1 3 || true
    done
    touch "/var/lib/babysitter/$NODE/kmsg"
    # simulated GPUs: the agent loads the fake libnvidia-ml through the real pynvml
    FAKE_NVML_STATE="/var/lib/babysitter/$NODE/nvml-state"
    export FAKE_NVML_STATE
    python -c "from babysitter.devcluster.fakenvml import FakeGpus; from pathlib import Path; FakeGpus(Path('$FAKE_NVML_STATE'))"
    LD_LIBRARY_PATH=$(find /opt/fakenvml -mindepth 1 -maxdepth 1 -type d | head -n 1)
    export LD_LIBRARY_PATH
    BABYSITTER_CONFIG="$CLUSTER/agent-$NODE.toml" babysitter agent &
    exec slurmd -D -N "$NODE" -f "$SLURM_CONF"
    ;;
controller)
    wait_for "$CLUSTER/controller.toml"
    start_munge
    export BABYSITTER_CONFIG="$CLUSTER/controller.toml"
    babysitter db upgrade
    exec babysitter controller
    ;;
alertmanager)
    exec prometheus-alertmanager --config.file=/opt/babysitter/src/docker/alertmanager.yml \
        --storage.path=/tmp/alertmanager --web.listen-address=0.0.0.0:9093 \
        --cluster.listen-address=
    ;;
*)
    echo "usage: entrypoint.sh slurmctld|node|controller|alertmanager" >&2
    exit 2
    ;;
esac
