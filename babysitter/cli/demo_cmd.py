"""`babysitter demo`: the five-minute tour."""

from __future__ import annotations

from pathlib import Path

import click


@click.command("demo")
@click.option(
    "--base",
    type=click.Path(file_okay=False, path_type=Path),
    help="Where to keep the demo's files (default: a temporary directory).",
)
@click.option("--keep", is_flag=True, help="Keep the files (logs, config, checkpoints).")
def demo(base: Path | None, keep: bool) -> int:
    """A real local Slurm cluster with simulated GPUs: a fault, the drain, the requeue from the
    last checkpoint, the alert and the recovery."""
    from babysitter.demo import run

    return run(base, keep)


commands = [demo]
