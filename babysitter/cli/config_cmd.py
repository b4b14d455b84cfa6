"""`babysitter config check|show`: validate and print the effective configuration."""

from __future__ import annotations

import click

from babysitter.cli.common import State, echo_json, pass_state


@click.group("config")
def config_group() -> None:
    """Validate or show the effective configuration (file + environment)."""


@config_group.command("check")
@pass_state
def config_check(state: State) -> None:
    """Exit 0 when the configuration is valid, else one line naming the bad key (exit 2)."""
    from babysitter.checks.all import check_config  # the check and signal names

    check_config(state.config)  # loading validated the rest
    click.echo("configuration ok")


@config_group.command("show")
@pass_state
def config_show(state: State) -> None:
    """Print the effective configuration as JSON."""
    from babysitter.config import as_dict

    echo_json(as_dict(state.config))


commands = [config_group]
