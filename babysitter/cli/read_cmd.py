"""Talk to the controller: `status`, `nodes`, `findings NODE`, `jobs` (tables for people, JSON
for scripts) and the admin actions `drain`, `resume`, `requeue`."""

from __future__ import annotations

from typing import Any

import click

from babysitter.cli.api_client import call, client, token_opt, url_opt
from babysitter.cli.common import State, echo_json, pass_state
from babysitter.cli.tables import echo, show, table


@click.command("status")
@url_opt
@token_opt
@click.option("--json", "as_json", is_flag=True)
@pass_state
def status(state: State, url: str | None, token: str | None, as_json: bool) -> None:
    """Cluster summary: nodes by verdict, open problems, pending actions, the guard."""
    with client(state, url, token) as c:
        nodes = call(c, "GET", "/api/v1/nodes")
        pending = call(c, "GET", "/api/v1/actions", params={"status": "pending"})
        guard = call(c, "GET", "/api/v1/guard")
        windows = call(c, "GET", "/api/v1/maintenance")
        healing = call(c, "GET", "/api/v1/ledger", params={"open": "true"})
        sdc = call(c, "GET", "/api/v1/sdc")
    by: dict[str, int] = {}
    for n in nodes:
        by[n["verdict"]] = by.get(n["verdict"], 0) + 1
    bad = [n for n in nodes if n["verdict"] != "healthy"]
    if as_json:
        echo_json(
            {
                "nodes": len(nodes),
                "by_verdict": by,
                "problem_nodes": bad,
                "pending_actions": pending,
                "guard": guard,
                "maintenance": windows,
                "remediations": healing,
                "sdc": sdc,
            }
        )
        return
    lines: list[object] = [
        f"{len(nodes)} nodes: " + ", ".join(f"{v} {k}" for k, v in sorted(by.items()))
    ]
    if bad:
        lines.append(
            table(
                "node",
                "verdict",
                "drained by babysitter",
                "problem",
                rows=[
                    [
                        n["name"],
                        n["verdict"],
                        "yes" if n["babysitter_drained"] else "",
                        n["open_findings"][0]["message"] if n["open_findings"] else "",
                    ]
                    for n in bad
                ],
            )
        )
    if healing:
        lines.append(
            f"{len(healing)} remediation(s) open (`babysitter ledger`): "
            + ", ".join(f"{r['node']} {r['rung']} {r['state']}" for r in healing[:10])
        )
    lines += [f"{len(pending)} pending actions", _guard_line(guard)]
    # a babysat job's requeue held for a link fault's grace: who waits, why, until when
    lines += [
        f"job {a['job_id']} on {a['node']}: requeue held for the link grace "
        f"({a.get('outcome') or 'held'})"
        for a in pending
        if a.get("kind") == "requeue" and a.get("rule") == "job_link_grace"
    ]
    lines += [
        f"maintenance: {w['hostlist']} until {w['ends_at']} ({w['reason']}, by "
        f"{w['created_by']}): not drained or paged by babysitter"
        for w in windows
    ]
    lines.append(_sdc_line(sdc))
    show(*lines)


def _sdc_line(rows: list[dict[str, Any]]) -> str:
    """The periodic SDC test in one line (`babysitter sdc-status` has it per node)."""
    tested = [r for r in rows if r.get("last_run_at")]
    if not tested:
        return "SDC test: no node tested yet (`babysitter sdc-status`)"
    last = max(tested, key=lambda r: str(r["last_run_at"]))
    testing = sum(1 for r in rows if r.get("testing"))
    failed = sum(1 for r in tested if r.get("last_code") == "sdc.failed")
    return (
        f"SDC test: {len(tested)} nodes tested, {failed} failed their last test, {testing} "
        f"under test now; latest {last['node']} at {str(last['last_run_at'])[:19]} "
        f"({last.get('last_library') or '?'})"
    )


def _guard_line(g: dict[str, Any]) -> str:
    if g.get("tripped"):
        return (
            f"guard: TRIPPED since {g.get('since') or '?'} ({g.get('rule')}"
            + (f": {g['rule_description']}" if g.get("rule_description") else "")
            + f"): {g.get('reason')} — `babysitter guard reset` after investigating"
        )
    if g.get("undecided"):
        return f"guard: undecided: {g.get('undecided_reason')}"
    return "guard: armed (drains allowed)"


@click.command("nodes")
@click.argument("node", required=False)
@url_opt
@token_opt
@click.option("--json", "as_json", is_flag=True)
@pass_state
def nodes(
    state: State, node: str | None, url: str | None, token: str | None, as_json: bool
) -> None:
    """Every node with verdict, heartbeat age and open findings; NODE: that node in full,
    with its remediation ledger."""
    if node:
        _one_node(state, node, url, token, as_json)
        return
    with client(state, url, token) as c:
        rows = call(c, "GET", "/api/v1/nodes")
    if as_json:
        echo_json(rows)
        return
    rows = [
        [
            n["name"],
            n["verdict"],
            n["heartbeat_age_s"],
            len(n["open_findings"]),
            n.get("slurm_state") or "",
        ]
        for n in rows
    ]
    show(table("node", "verdict", "heartbeat age s", "open findings", "slurm", rows=rows))


def _one_node(state: State, node: str, url: str | None, token: str | None, as_json: bool) -> None:
    from babysitter.cli.ledger_cmd import LEDGER_COLUMNS, ledger_rows

    with client(state, url, token) as c:
        n = call(c, "GET", f"/api/v1/nodes/{node}")
    if as_json:
        echo_json(n)
        return
    echo(f"{n['name']}: {n['verdict']} (slurm {n.get('slurm_state') or '?'})")
    if n.get("slurm_reason"):
        echo(f"  reason: {n['slurm_reason']}")
    for f in n["open_findings"]:
        echo(f"  {f['severity']:8} {f['check']}: {f['message']}")
    ledger = n.get("ledger") or []
    echo(f"remediation ledger ({len(ledger)} row(s), newest first):")
    if ledger:
        show(table(*LEDGER_COLUMNS, rows=ledger_rows(ledger)))
    for a in n.get("rma_archives") or []:  # RMA evidence (docs/operations.md#rma_evidence)
        where = f"{str(c.base_url).rstrip('/')}{a['url']}" if a.get("url") else ""
        echo(
            f"RMA evidence {a['state']} {a['created_at']} ({a['trigger']}): {where or a['outcome']}"
        )


@click.command("findings")
@click.argument("node")
@url_opt
@token_opt
@click.option("--json", "as_json", is_flag=True)
@click.option(
    "--since",
    help="ISO time to list from (default: the controller's history_lookback_days)",
)
@pass_state
def findings(
    state: State,
    node: str,
    url: str | None,
    token: str | None,
    as_json: bool,
    since: str | None,
) -> None:
    """Finding history of NODE (by default within the controller's lookback window)."""
    params = {"node": node, **({"since": since} if since else {})}
    with client(state, url, token) as c:
        rows = call(c, "GET", "/api/v1/findings", params=params)
    if as_json:
        echo_json(rows)
        return
    cells = [
        [f["observed_at"], f["severity"], f["check"], f["component"], f["message"]] for f in rows
    ]
    show(table("observed", "severity", "check", "component", "message", rows=cells))


@click.command("jobs")
@url_opt
@token_opt
@click.option("--json", "as_json", is_flag=True)
@pass_state
def jobs(state: State, url: str | None, token: str | None, as_json: bool) -> None:
    """Babysat jobs, their requeues and resume points."""
    with client(state, url, token) as c:
        rows = call(c, "GET", "/api/v1/jobs")
    if as_json:
        echo_json(rows)
        return
    cells = [
        [
            j["job_id"],
            j.get("state") or "",
            ",".join(j.get("nodes") or []),
            j["restart_count"],
            j["requeues"],
            j.get("resume_point") or "",
        ]
        for j in rows
    ]
    show(table("job", "state", "nodes", "restarts", "requeues", "resume from", rows=cells))


@click.command("drain")
@click.argument("node")
@click.option("--reason", required=True)
@url_opt
@token_opt
@pass_state
def drain(state: State, node: str, reason: str, url: str | None, token: str | None) -> None:
    """Ask the controller to drain NODE (recorded in its action log)."""
    with client(state, url, token) as c:
        r = call(c, "POST", f"/api/v1/nodes/{node}/drain", json={"reason": reason})
    echo(f"drain of {node} requested (action {r['action_id']})")


@click.command("resume")
@click.argument("node")
@url_opt
@token_opt
@pass_state
def resume(state: State, node: str, url: str | None, token: str | None) -> None:
    """Ask the controller to resume NODE (only babysitter's own drains)."""
    with client(state, url, token) as c:
        r = call(c, "POST", f"/api/v1/nodes/{node}/resume")
    echo(f"resume of {node} requested (action {r['action_id']})")


@click.command("requeue")
@click.argument("job_id", type=int)
@url_opt
@token_opt
@pass_state
def requeue(state: State, job_id: int, url: str | None, token: str | None) -> None:
    """Ask the controller to requeue JOB_ID."""
    with client(state, url, token) as c:
        r = call(c, "POST", f"/api/v1/jobs/{job_id}/requeue")
    echo(f"requeue of {job_id} requested (action {r['action_id']})")


@click.group("guard", invoke_without_command=True)
@url_opt
@token_opt
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
def guard(ctx: click.Context, url: str | None, token: str | None, as_json: bool) -> None:
    """The blast-radius guard: the cluster-wide breaker, the scoped node-drain caps
    ([blast_radius]) and the open switch incidents. `guard reset` re-arms the breaker."""
    if ctx.invoked_subcommand is not None:
        return
    state = ctx.find_object(State)
    assert state is not None
    with client(state, url, token) as c:
        g = call(c, "GET", "/api/v1/guard")
    if as_json:
        echo_json(g)
        return
    for line in guard_lines(g):
        echo(line)


def guard_lines(g: dict[str, Any]) -> list[str]:
    """The guard for people: the breaker, each cap (tripped ones with where and why), each
    open switch incident."""
    lines = [_guard_line(g)]
    blast = g.get("blast_radius") or {}
    caps = blast.get("caps") or {}
    tripped = blast.get("tripped") or []
    if not caps:
        lines.append("caps: none set ([blast_radius]); the breaker above is the only limit")
    for scope, cap in sorted(caps.items()):
        limits = [
            f"{cap['fraction']:.0%}" if cap.get("fraction") is not None else "",
            f"{cap['count']} nodes" if cap.get("count") is not None else "",
        ]
        hits = [t for t in tripped if t.get("scope") == scope]
        state = f"TRIPPED in {len(hits)}" if hits else "ok"
        lines.append(f"cap per {scope} ({' or '.join(x for x in limits if x)}): {state}")
        lines += [f"  {t.get('reason')}" for t in hits]
    for inc in g.get("switch_incidents") or []:
        lines.append(
            f"switch {inc.get('switch')} suspected since {inc.get('opened_at')}: "
            f"{', '.join(inc.get('nodes') or [])}"
            + (f" (jobs {', '.join(map(str, inc['jobs']))})" if inc.get("jobs") else "")
        )
    for inc in g.get("nvlink_domain_incidents") or []:
        lines.append(
            f"NVLink domain {inc.get('switch')} suspected since {inc.get('opened_at')}: "
            f"{', '.join(inc.get('nodes') or [])}"
        )
    return lines


@guard.command("reset")
@url_opt
@token_opt
@pass_state
def guard_reset(state: State, url: str | None, token: str | None) -> None:
    """Let babysitter drain again after the guard tripped (recorded in the action log)."""
    with client(state, url, token) as c:
        r = call(c, "POST", "/api/v1/guard/reset")
    echo(f"guard reset requested (action {r['action_id']})")


commands = [status, nodes, findings, jobs, drain, resume, requeue, guard]
