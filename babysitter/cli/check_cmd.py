"""`babysitter check`: run the checks once, like NHC. Nagios exit codes; `--slurm-drain` makes
it a Slurm HealthCheckProgram (drain own node on critical, resume it when clean, only if the
drain was this mode's own: reason `<prefix> [healthcheck] …`). Drains the controller made
(SDC, NVML events, NCCL — checks this one-shot run never repeats) are the controller's to
resume."""

from __future__ import annotations

import click

from babysitter.checks.all import select_checks
from babysitter.checks.base import CheckContext, run_checks
from babysitter.cli.common import State, echo_json, pass_state
from babysitter.errors import UsageError
from babysitter.finding import Finding, Severity, exit_code, worst

# As a HealthCheckProgram this runs every few minutes on every node: rich (tables) and the Slurm
# client are imported only when used.
_STYLE = {
    Severity.CRITICAL: "bold red",
    Severity.WARNING: "yellow",
    Severity.INFO: "cyan",
    Severity.OK: "green",
}


def drain_summary(findings: list[Finding]) -> str:
    crit = [f for f in findings if f.severity is Severity.CRITICAL]
    first = crit[0]
    more = f" (+{len(crit) - 1} more)" if len(crit) > 1 else ""
    return f"{first.check}: {first.message}{more}"


@click.command("check")
@click.option("--only", default="", help="Comma-separated check names or prefixes (gpu,xid).")
@click.option("--json", "as_json", is_flag=True, help="Print the findings as a JSON list.")
@click.option(
    "--slurm-drain",
    is_flag=True,
    help="Drain this node on a critical finding; resume it when clean (own drains only).",
)
@pass_state
def check(state: State, only: str, as_json: bool, slurm_drain: bool) -> int:
    """Run the checks once; exit 0 ok, 1 warning, 2 critical, 3 unknown."""
    cfg = state.config
    wanted = [w.strip() for w in only.split(",") if w.strip()]
    ctx = CheckContext(cfg, cfg.agent.node_name)
    checks = select_checks(ctx, wanted or None)
    if wanted and not checks:
        raise UsageError(f"--only {only!r} matches no check")
    results = run_checks(checks)
    findings = [f for r in results for f in r.findings]
    unknown = any(r.unknown for r in results)
    code = exit_code(findings, unknown=unknown)
    if as_json:
        echo_json([f.to_json_dict() for f in findings])
    else:
        _print_table(findings)
    if slurm_drain:
        _slurm_drain(state, cfg.agent.node_name, findings)
    return code


def _print_table(findings: list[Finding]) -> None:
    from rich.console import Console
    from rich.table import Table

    con = Console()
    problems = [f for f in findings if f.severity is not Severity.OK]
    healthy = {(f.check, f.component) for f in findings if f.severity is Severity.OK}
    if problems:
        t = Table("severity", "check", "component", "code", "message")
        for f in sorted(problems, key=lambda f: (-f.severity.rank, f.check, f.component)):
            t.add_row(
                f"[{_STYLE[f.severity]}]{f.severity}[/]", f.check, f.component, f.code, f.message
            )
        con.print(t)
    con.print(
        f"{len(healthy)} check/component pairs ok; worst: {worst(findings)} "
        "(--json for every finding)"
    )


def _slurm_drain(state: State, node: str, findings: list[Finding]) -> None:
    from rich.console import Console

    # the controller's policy module only for --slurm-drain (its import is ~0.05 s of CPU)
    from babysitter.controller.policy import HEALTHCHECK_MARK
    from babysitter.slurm.client import SlurmError, SlurmNotOwned
    from babysitter.slurm.factory import make_client

    err = Console(stderr=True)
    client = make_client(state.config)
    mine = f"{state.config.slurm.reason_prefix} {HEALTHCHECK_MARK}"
    try:
        current = client.node(node)
        held = current.drained_or_draining or current.down
        if worst(findings) is Severity.CRITICAL:
            controllers = current.reason.startswith(state.config.slurm.reason_prefix)
            if held and controllers and not current.reason.startswith(mine):
                # the controller's drain stays the controller's (never rewritten as ours)
                err.print(f"left {node} alone: drained by the babysitter controller")
                return
            client.drain(node, f"{HEALTHCHECK_MARK} {drain_summary(findings)}")
            err.print(f"drained {node}")
        elif held and current.reason.startswith(mine):
            client.resume(node)
            err.print(f"resumed {node}")
        elif held and current.reason:
            err.print(f"left {node} alone: not drained by this check ({current.reason!r})")
    except SlurmNotOwned as exc:
        err.print(f"left {node} alone: {exc}")
    except SlurmError as exc:
        err.print(f"could not update Slurm for {node}: {exc}")


commands = [check]
