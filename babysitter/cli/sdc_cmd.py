"""`babysitter sdc-test`: one silent-data-corruption matmul test on every local device."""

from __future__ import annotations

from typing import get_args

import click

from babysitter.checks.sdc.settings import SdcDtype
from babysitter.cli.api_client import call, client, token_opt, url_opt
from babysitter.cli.common import State, echo_json, pass_state
from babysitter.cli.tables import show, table
from babysitter.errors import UsageError
from babysitter.finding import exit_code


def parse_inject(text: str | None) -> tuple[int, int, int, int] | None:
    """`--inject DEV,I,J,BIT` (also used by `babysitter validate`)."""
    if not text:
        return None
    try:
        d, i, j, bit = (int(x) for x in text.split(","))
    except ValueError:
        raise UsageError("--inject wants DEV,I,J,BIT (four integers)") from None
    return (d, i, j, bit)


@click.command("sdc-test")
@click.option("--backend", type=click.Choice(["auto", "numpy", "torch", "cupy"]), default=None)
@click.option("--size", type=click.IntRange(16, 65536), default=None, help="Matrix size n.")
@click.option("--dtype", type=click.Choice(get_args(SdcDtype)), default=None)
@click.option("--seed", type=int, default=None)
@click.option(
    "--devices",
    "replicas",
    type=click.IntRange(1, 64),
    default=1,
    help="CPU backends: run on this many CPU 'devices' (stand-ins for GPUs).",
)
@click.option(
    "--inject",
    default=None,
    metavar="DEV,I,J,BIT",
    help="Fault injection: flip BIT of C[I,J] on device DEV before verification.",
)
@click.option("--json", "as_json", is_flag=True)
@pass_state
def sdc_test(
    state: State,
    backend: str | None,
    size: int | None,
    dtype: str | None,
    seed: int | None,
    replicas: int,
    inject: str | None,
    as_json: bool,
) -> int:
    """Seeded matmul on every device, checked with ABFT checksums and across devices."""
    from babysitter.checks.sdc.backends import BackendUnavailable
    from babysitter.checks.sdc.runner import run_sdc

    cfg = state.config.checks.sdc
    inj = parse_inject(inject)
    try:
        res = run_sdc(
            backend or cfg.backend,
            size or cfg.size,
            dtype or cfg.dtype,
            cfg.seed if seed is None else seed,
            replicas=replicas,
            inject=inj,
            state_dir=state.config.agent.spool_path.parent,
        )
    except (BackendUnavailable, ValueError, IndexError) as exc:
        raise UsageError(str(exc)) from None
    if as_json:
        echo_json([f.to_json_dict() for f in res.findings])
    else:
        cells = [
            [
                r.label,
                r.model[:30],
                f.code,
                f"{r.gflops:.0f}",
                f"{r.verify_s * 1e3:.1f}",
                f"{r.abft_worst_ratio:.3g}",
            ]
            for r, f in zip(res.devices, res.findings, strict=True)
        ]
        columns = ("device", "model", "result", "GFLOP/s", "verify ms", "ABFT ratio")
        show(table(*columns, rows=cells))
    return exit_code(res.findings)


@click.command("sdc-status")
@click.argument("node", required=False)
@url_opt
@token_opt
@click.option("--json", "as_json", is_flag=True)
@pass_state
def sdc_status(
    state: State, node: str | None, url: str | None, token: str | None, as_json: bool
) -> None:
    """The periodic SDC test per node: last tested when, with which backend and result, under
    test now, or why a due node is not being tested."""
    with client(state, url, token) as c:
        rows = call(c, "GET", "/api/v1/sdc", params={"node": node} if node else None)
    if as_json:
        echo_json(rows)
        return
    cells = []
    for r in rows:
        gflops = r.get("last_gflops") or {}
        cells.append(
            [
                r["node"],
                str(r.get("last_run_at") or "never")[:19],
                r.get("last_library") or "",
                r.get("last_code") or "",
                f"{min(gflops.values()):.0f}" if gflops else "",
                "under test" if r.get("testing") else (r.get("waiting") or ""),
            ]
        )
    columns = ("node", "last tested", "backend", "result", "GFLOP/s (min)", "now")
    show(table(*columns, rows=cells))


commands = [sdc_test, sdc_status]
