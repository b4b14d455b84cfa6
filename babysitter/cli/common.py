"""Shared CLI plumbing: per-invocation state, output helpers."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

if TYPE_CHECKING:
    from babysitter.config import Config


class State:
    """Per-invocation state: the --config path and the (lazily loaded) config."""

    def __init__(self, config_path: str | None) -> None:
        self.config_path = config_path
        self._config: Config | None = None

    @property
    def config(self) -> Config:
        if self._config is None:
            from babysitter.config import load_config  # only for commands that need it

            self._config = load_config(self.config_path)
        return self._config


pass_state = click.make_pass_decorator(State)


def _set_config(ctx: click.Context, _param: click.Parameter, value: str | None) -> None:
    if value is not None:
        state = ctx.ensure_object(State)
        state.config_path, state._config = value, None


def config_option(f: Any) -> Any:
    """`--config FILE` after the command as well (`babysitter agent --config F`, the form the
    systemd units and the design use); the group's `babysitter --config F agent` still works."""
    return click.option(
        "--config",
        type=click.Path(dir_okay=False),
        expose_value=False,
        callback=_set_config,
        help="TOML config (default /etc/babysitter/babysitter.toml).",
    )(f)


def echo_json(data: Any) -> None:
    """Machine output: one JSON document on stdout."""
    from babysitter.cli.check_run import json_text

    click.echo(json_text(data))
