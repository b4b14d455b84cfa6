"""`babysitter check` in the click tree (help, docs, tests through click). The command line
itself never comes here: `babysitter.cli.main` sends `check` to `check_run` before importing
click, since as a Slurm HealthCheckProgram it runs on every node every few minutes."""

from __future__ import annotations

import click

from babysitter.cli import check_run
from babysitter.cli.common import State, pass_state


@click.command("check", help=check_run.SUMMARY)
@click.option("--only", default="", help=check_run.ONLY_HELP)
@click.option("--json", "as_json", is_flag=True, help=check_run.JSON_HELP)
@click.option("--slurm-drain", is_flag=True, help=check_run.DRAIN_HELP)
@pass_state
def check(state: State, only: str, as_json: bool, slurm_drain: bool) -> int:
    return check_run.run(state.config, only, as_json, slurm_drain)


commands = [check]
