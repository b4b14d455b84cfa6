"""`babysitter resume-path`: inside a job, print the checkpoint to resume from."""

from __future__ import annotations

from pathlib import Path

import click

from babysitter import job


@click.command("resume-path")
@click.option(
    "--ckpt",
    type=click.Path(file_okay=False, path_type=Path),
    help="Checkpoint directory (default: $BABYSIT_CKPT).",
)
def resume_path(ckpt: Path | None) -> None:
    """Print the checkpoint to resume from (empty on a fresh start)."""
    click.echo(job.resume_path(ckpt) or "")


commands = [resume_path]
