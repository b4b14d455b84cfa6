"""`babysitter controller`, `agent`, `token NODE`, `db upgrade`."""

from __future__ import annotations

from pathlib import Path

import click

from babysitter.cli.common import State, config_option, pass_state


@click.command("controller")
@config_option
@pass_state
def controller(state: State) -> None:
    """API + store + policy/remediation loop + alerts."""
    from babysitter.controller.runtime import Controller

    Controller(state.config, state.config_path).serve()


@click.command("agent")
@config_option
@pass_state
def agent(state: State) -> None:
    """Node daemon: checks on schedule and on events, reports, spool."""
    from babysitter.agent.daemon import Agent

    Agent(state.config, state.config_path).run()


@click.command("token")
@click.argument("node")
@click.option(
    "--write",
    "path",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write the token to this file, created with mode 0600 (replaced atomically).",
)
@pass_state
def token(state: State, node: str, path: Path | None) -> None:
    """Print NODE's API token (derived from the cluster secret), or write it to a file."""
    from babysitter.controller.api.auth import node_token
    from babysitter.secretfile import read_secret, write_private

    secret = read_secret(state.config.controller.cluster_secret_file, "cluster secret")
    if path is None:
        click.echo(node_token(secret, node))
    else:
        write_private(path, node_token(secret, node) + "\n")
        click.echo(f"wrote {node}'s token to {path} (mode 0600)", err=True)


@click.group("db")
def db() -> None:
    """Database maintenance."""


@db.command("upgrade")
@config_option
@pass_state
def db_upgrade(state: State) -> None:
    """Apply migrations (Alembic, sql/)."""
    from babysitter.controller.db.store import Store

    store = Store(state.config.controller.database_url)
    try:
        store.upgrade()
    finally:
        store.close()
    click.echo("database is up to date")


commands = [controller, agent, token, db]
