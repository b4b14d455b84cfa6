"""`babysitter audit [--node N] [--since T]`: what babysitter and admins did, newest first,
with the evidence behind each action and its result."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import click

from babysitter.cli.api_client import call, client, token_opt, url_opt
from babysitter.cli.common import State, echo_json, pass_state
from babysitter.cli.tables import echo, show, table
from babysitter.cli.when import TimeParam


def evidence_line(evidence: list[dict[str, Any]]) -> str:
    """The findings behind an action, one short line (the API and --json have them whole)."""
    parts = [f"{f.get('code', '?')} {f.get('component', '')}".strip() for f in evidence[:3]]
    more = len(evidence) - len(parts)
    return ", ".join(parts) + (f" (+{more})" if more > 0 else "")


@click.command("audit")
@click.option("--node", help="Only this node's entries.")
@click.option(
    "--since",
    type=TimeParam(past=True),
    help="Only entries from this time on: ISO time or a duration back from now (2h, 7d).",
)
@click.option("--limit", type=click.IntRange(1, 10_000), default=200, show_default=True)
@url_opt
@token_opt
@click.option("--json", "as_json", is_flag=True)
@pass_state
def audit(
    state: State,
    node: str | None,
    since: datetime | None,
    limit: int,
    url: str | None,
    token: str | None,
    as_json: bool,
) -> None:
    """The audit log: every action with actor, time, evidence and result."""
    params: dict[str, Any] = {"limit": limit}
    if node:
        params["node"] = node
    if since:
        params["since"] = since.isoformat()
    with client(state, url, token) as c:
        rows = call(c, "GET", "/api/v1/audit", params=params)
    if as_json:
        echo_json(rows)
        return
    cells = []
    for e in rows:
        target = e.get("node") or ""
        if e.get("job_id"):
            target = f"{target} job {e['job_id']}".strip()
        cells.append(
            [
                e["at"],
                e["actor"],
                e["kind"],
                target,
                e["result"],
                e.get("reason") or "",
                evidence_line(e.get("evidence") or []),
                e.get("outcome") or "",
            ]
        )
    columns = ("at", "actor", "action", "node/job", "result", "reason", "evidence", "outcome")
    show(table(*columns, rows=cells))
    if not rows:
        echo("no audit entries" + (f" for {node}" if node else ""))


commands = [audit]
