"""Root of the `babysitter` command. Sub-commands live in their own modules, listed explicitly
in COMMAND_MODULES; each module exposes `commands: list[click.Command]`. A module is imported
only when one of its commands runs (COMMANDS names them): `babysitter check` as a Slurm
HealthCheckProgram and the agent on every node must not pay for the controller's imports."""

from __future__ import annotations

import importlib
import logging
import sys
from typing import Any

import click

from babysitter import __version__
from babysitter.cli.common import State
from babysitter.errors import BabysitterError

COMMANDS: dict[str, str] = {
    "config": "babysitter.cli.config_cmd",
    "devcluster": "babysitter.cli.devcluster_cmd",
    "slurm": "babysitter.cli.slurm_cmd",
    "check": "babysitter.cli.check_cmd",
    "controller": "babysitter.cli.daemon_cmd",
    "agent": "babysitter.cli.daemon_cmd",
    "token": "babysitter.cli.daemon_cmd",
    "db": "babysitter.cli.daemon_cmd",
    "status": "babysitter.cli.read_cmd",
    "nodes": "babysitter.cli.read_cmd",
    "findings": "babysitter.cli.read_cmd",
    "jobs": "babysitter.cli.read_cmd",
    "drain": "babysitter.cli.read_cmd",
    "resume": "babysitter.cli.read_cmd",
    "requeue": "babysitter.cli.read_cmd",
    "guard": "babysitter.cli.read_cmd",
    "resume-path": "babysitter.cli.job_cmd",
    "demo": "babysitter.cli.demo_cmd",
    "sdc-test": "babysitter.cli.sdc_cmd",
    "validate": "babysitter.cli.validate_cmd",
}

COMMAND_MODULES: list[str] = [
    "babysitter.cli.config_cmd",
    "babysitter.cli.devcluster_cmd",
    "babysitter.cli.slurm_cmd",
    "babysitter.cli.check_cmd",
    "babysitter.cli.daemon_cmd",
    "babysitter.cli.read_cmd",
    "babysitter.cli.job_cmd",
    "babysitter.cli.demo_cmd",
    "babysitter.cli.sdc_cmd",
    "babysitter.cli.validate_cmd",
]


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
    level = logging.WARNING - 10 * min(verbose, 2)
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    ctx.obj = State(config_path)


def load_all_commands() -> None:
    """Import every command module (docs, tests of the whole tree)."""
    for mod_name in COMMAND_MODULES:
        for cmd in importlib.import_module(mod_name).commands:
            cli.add_command(cmd)


def main(argv: list[str] | None = None) -> Any:
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
        click.echo(f"error: {exc}", err=True)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        sys.exit(130)
    # commands return their exit code (Nagios codes for `check`), or None for 0
    sys.exit(rv if isinstance(rv, int) else 0)


if __name__ == "__main__":
    main()
