"""`babysitter devcluster up|down`: a real local Slurm cluster."""

from __future__ import annotations

import shlex
from pathlib import Path

import click

from babysitter.cli.common import echo_json
from babysitter.devcluster.cluster import DEFAULT_BASE, DevCluster


@click.group("devcluster")
def devcluster_group() -> None:
    """A real local Slurm cluster (munged, slurmctld, N x slurmd -N, slurmrestd)."""


def _leafs(value: str | None) -> int:
    """`leafs=N` -> N (0: no topology)."""
    if value is None:
        return 0
    key, _, n = value.partition("=")
    if key.strip() != "leafs" or not n.strip().isdigit() or int(n) < 1:
        raise click.BadParameter(f"expected leafs=N (N >= 1), got {value!r}")
    return int(n)


@devcluster_group.command("up")
@click.option("--nodes", "n_nodes", default=4, show_default=True, type=click.IntRange(1, 64))
@click.option(
    "--base",
    type=click.Path(file_okay=False, path_type=Path),
    default=DEFAULT_BASE,
    show_default=True,
    help="All cluster state lives here.",
)
@click.option(
    "--extra-nodes",
    default=0,
    show_default=True,
    type=click.IntRange(0, 100_000),
    help="Also configure N nodes without a slurmd (fake00001..; State=DOWN, drainable) "
    "for scale tests.",
)
@click.option("--json", "as_json", is_flag=True, help="Print {slurm_conf, base, nodes, ...}.")
@click.option(
    "--slurm",
    "slurm_version",
    type=click.Choice(["22.05", "24.11", "25.11", "26.05"]),
    default=None,
    help="Slurm version (default: the host's; 24.11/26.05 from Debian roots, 25.11 built "
    "from source).",
)
@click.option(
    "--topology",
    "topology",
    default=None,
    metavar="leafs=N",
    callback=lambda _ctx, _param, value: _leafs(value),
    help="Write topology.conf with TopologyPlugin=topology/tree: the nodes split evenly over "
    "N leaf switches (leaf1..leafN) under one spine.",
)
@click.option(
    "--reboot-hook",
    default=None,
    metavar="CMD",
    help="Set RebootProgram so that `scontrol reboot` power-cycles a node for real to "
    "slurmctld: slurmd stops, `CMD NODE` runs (the site's power cycle; '' for none), slurmd "
    "starts again with -b and reports the boot (host Slurm or 25.11).",
)
def up(
    n_nodes: int,
    extra_nodes: int,
    base: Path,
    as_json: bool,
    slurm_version: str | None,
    topology: int,
    reboot_hook: str | None,
) -> None:
    """Start the cluster and wait until every node is idle."""
    info = DevCluster(
        base,
        nodes=n_nodes,
        slurm=slurm_version,
        extra_nodes=extra_nodes,
        topology_leafs=topology,
        reboot_hook=None if reboot_hook is None else shlex.split(reboot_hook),
    ).up()
    if as_json:
        echo_json(info.public())
        return
    click.echo(
        f"Slurm {info.slurm_version} cluster up: {len(info.nodes)} nodes "
        f"({', '.join(info.nodes)}), 8 GPUs each (simulated)"
    )
    if info.extra_nodes:
        fake = info.fake_nodes
        click.echo(
            f"  plus {info.extra_nodes} nodes without a slurmd ({fake[0]}..{fake[-1]}, "
            "State=DOWN, drainable)"
        )
    if reboot_hook is not None:
        click.echo(f"  scontrol reboot runs: {reboot_hook or '(no hook)'} NODE, then slurmd -b")
    if topology:
        click.echo(f"  topology/tree: {topology} leaf switch(es) under one spine (topology.conf)")
    click.echo(f"  export SLURM_CONF={info.slurm_conf}")
    if info.bin:
        click.echo(f"  export PATH={info.bin}:$PATH   # this version's sinfo/scontrol/...")
    click.echo(f"  slurmrestd: unix://{info.restd_socket}")
    click.echo(f"  stop with: babysitter devcluster down --base {info.base}")


@devcluster_group.command("down")
@click.option(
    "--base",
    type=click.Path(file_okay=False, path_type=Path),
    default=DEFAULT_BASE,
    show_default=True,
)
def down(base: Path) -> None:
    """Stop every process of the cluster at --base (fine when already down)."""
    DevCluster(base).down()
    click.echo(f"devcluster at {base} is down")


commands = [devcluster_group]
