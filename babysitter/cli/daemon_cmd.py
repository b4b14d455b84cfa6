"""`babysitter controller`, `agent`, `token NODE`, `db upgrade`."""

from __future__ import annotations

import click

from babysitter.cli.common import State, pass_state


@click.command("controller")
@pass_state
def controller(state: State) -> None:
    """API + store + policy/remediation loop + alerts."""
    from babysitter.controller.runtime import Controller

    Controller(state.config).serve()


@click.command("agent")
@pass_state
def agent(state: State) -> None:
    """Node daemon: checks on schedule and on events, reports, spool."""
    from babysitter.agent.daemon import Agent

    Agent(state.config).run()


@click.command("token")
@click.argument("node")
@pass_state
def token(state: State, node: str) -> None:
    """Print NODE's API token (derived from the cluster secret)."""
    from babysitter.controller.auth import node_token, read_secret

    secret = read_secret(state.config.controller.cluster_secret_file, "cluster secret")
    click.echo(node_token(secret, node))


@click.group("db")
def db() -> None:
    """Database maintenance."""


@db.command("upgrade")
@pass_state
def db_upgrade(state: State) -> None:
    """Apply migrations (Alembic, babysitter/sql/)."""
    from babysitter.controller.store import Store

    store = Store(state.config.controller.database_url)
    try:
        store.upgrade()
    finally:
        store.close()
    click.echo("database is up to date")


commands = [controller, agent, token, db]
