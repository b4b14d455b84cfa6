"""The click command tree of `babysitter` (every command but the HealthCheckProgram path of
`check`, which `babysitter.cli.main` runs without click). Sub-commands live in their own
modules, listed in `babysitter.cli.commands`; a module is imported only when one of its
commands runs: the agent on every node must not pay for the controller's imports."""

from __future__ import annotations

import importlib
import sys
from typing import Any

import click

from babysitter import __version__
from babysitter.cli.check_run import configure_logging
from babysitter.cli.commands import COMMAND_MODULES, COMMANDS
from babysitter.cli.common import State
from babysitter.errors import BabysitterError


class LazyGroup(click.Group):
    """Imports a command's module when that command is asked for (help lists them all)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(COMMANDS) | set(self.commands))

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in COMMANDS:
            mod = importlib.import_module(COMMANDS[cmd_name])
            for cmd in mod.commands:
                self.add_command(cmd)
        return self.commands.get(cmd_name)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False),
    envvar="BABYSITTER_CONFIG",
    help="TOML config (default /etc/babysitter/babysitter.toml).",
)
@click.option("-v", "--verbose", count=True, help="More logging (-vv for debug).")
@click.version_option(__version__, prog_name="babysitter")
@click.pass_context
def cli(ctx: click.Context, config_path: str | None, verbose: int) -> None:
    """babysitter: finds broken GPU nodes, takes them out of Slurm, requeues the jobs from their
    last good checkpoint, and tells on-call."""
    configure_logging(verbose)
    ctx.obj = State(config_path)


def load_all_commands() -> None:
    """Import every command module (docs, tests of the whole tree)."""
    for mod_name in COMMAND_MODULES:
        for cmd in importlib.import_module(mod_name).commands:
            cli.add_command(cmd)


def run(argv: list[str] | None) -> Any:
    try:
        rv = cli.main(args=argv, prog_name="babysitter", standalone_mode=False)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        sys.exit(130)
    except BabysitterError as exc:
        from babysitter.cli.tables import printable  # only on this path: rich is heavy

        click.echo(f"error: {printable(exc)}", err=True)  # may quote the controller's answer
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        sys.exit(130)
    # commands return their exit code (Nagios codes for `check`), or None for 0
    sys.exit(rv if isinstance(rv, int) else 0)
