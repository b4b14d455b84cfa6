"""`babysitter slurm …`: Slurm operations straight through the Slurm client (no controller),
with the same ownership rules the controller follows."""

from __future__ import annotations

import dataclasses

import click

from babysitter.cli.common import State, echo_json, pass_state
from babysitter.cli.tables import echo, show, table
from babysitter.slurm.client import SlurmClient
from babysitter.slurm.factory import make_client


def _client(state: State) -> SlurmClient:
    return make_client(state.config)


@click.group("slurm")
def slurm_group() -> None:
    """Drain, resume, requeue and list through the configured Slurm backend."""


@slurm_group.command("nodes")
@click.option("--json", "as_json", is_flag=True)
@pass_state
def nodes(state: State, as_json: bool) -> None:
    """List nodes with state, flags and reason."""
    rows = _client(state).nodes()
    if as_json:
        echo_json([{**dataclasses.asdict(n), "flags": sorted(n.flags)} for n in rows])
        return
    cells = [[n.name, n.state, ",".join(sorted(n.flags)), n.reason] for n in rows]
    show(table("node", "state", "flags", "reason", rows=cells))


@slurm_group.command("jobs")
@click.option("--json", "as_json", is_flag=True)
@pass_state
def jobs(state: State, as_json: bool) -> None:
    """List jobs with state, nodes, restart count and AdminComment."""
    rows = _client(state).jobs()
    if as_json:
        echo_json([dataclasses.asdict(j) for j in rows])
        return
    cells = [
        [
            j.job_id,
            "+".join(j.states),
            ",".join(j.nodes),
            j.restart_count,
            ",".join(j.excluded_nodes),
            j.admin_comment,
        ]
        for j in rows
    ]
    show(table("job", "state", "nodes", "restarts", "excluded", "admin comment", rows=cells))


@slurm_group.command("drain")
@click.argument("node")
@click.option("--reason", required=True, help="Why; the reason prefix is added.")
@pass_state
def drain(state: State, node: str, reason: str) -> None:
    """Drain NODE (never overwrites a reason that is not babysitter's)."""
    c = _client(state)
    c.drain(node, reason)
    echo(f"drained {node}: {c.full_reason(reason) if hasattr(c, 'full_reason') else reason}")


@slurm_group.command("resume")
@click.argument("node")
@pass_state
def resume(state: State, node: str) -> None:
    """Resume NODE, only if babysitter drained it."""
    _client(state).resume(node)
    echo(f"resumed {node}")


@slurm_group.command("requeue")
@click.argument("job_id", type=int)
@click.option("--exclude", default="", help="Comma-separated nodes to keep the job away from.")
@click.option("--hold", is_flag=True, help="Requeue held (requeuehold).")
@pass_state
def requeue(state: State, job_id: int, exclude: str, hold: bool) -> None:
    """Requeue JOB_ID, then exclude nodes while it is pending."""
    excl = [n for n in exclude.split(",") if n]
    _client(state).requeue(job_id, exclude=excl, hold=hold)
    echo(f"requeued {job_id}" + (f", excluding {','.join(excl)}" if excl else ""))


commands = [slurm_group]
