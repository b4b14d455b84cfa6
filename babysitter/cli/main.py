"""Entry point of the `babysitter` command. `check` (Slurm's HealthCheckProgram, every node,
every few minutes) runs through `check_run` with argparse; every other command through the click
tree in `tree`, imported only then (click alone costs more CPU than a whole NHC run)."""

from __future__ import annotations

import sys
from typing import Any

from babysitter.cli.commands import COMMAND_MODULES, COMMANDS

__all__ = ["COMMANDS", "COMMAND_MODULES", "main"]


def main(argv: list[str] | None = None) -> Any:
    args = sys.argv[1:] if argv is None else list(argv)
    from babysitter.cli import check_run

    if check_run.is_check(args):
        check_run.leave(check_run.main(args))  # a one-shot process: no interpreter teardown
    from babysitter.cli.tree import run

    run(args)


if __name__ == "__main__":
    main()
