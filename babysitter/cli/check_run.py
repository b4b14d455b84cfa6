"""`babysitter check` without click: the HealthCheckProgram path. Slurm runs it on every node
every few minutes, so it imports only the checks, the config and the standard library; click,
rich and pydantic stay out, and a plain command line (what slurm.conf holds) is read without
argparse (its import and its help formatter's cost more memory than the checks).
`babysitter.cli.main` sends `check` here before it imports click; `check_cmd` is the same
command in the click tree (help, docs) and calls the same `run`.

Nagios exit codes; `--slurm-drain` makes it a Slurm HealthCheckProgram (drain own node on
critical, resume it when clean, only if the drain was this mode's own: reason
`<prefix> [healthcheck] …`). Drains the controller made (SDC, NVML events, NCCL — checks this
one-shot run never repeats) are the controller's to resume."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, NoReturn

from babysitter import __version__
from babysitter.errors import BabysitterError, UsageError
from babysitter.finding import (
    EXIT_CRITICAL,
    EXIT_UNKNOWN,
    Finding,
    Severity,
    exit_code,
    no_verdict,
    worst,
)

if TYPE_CHECKING:
    import argparse

    from babysitter.config import Config

ONLY_HELP = "Comma-separated check names or prefixes (gpu,xid)."
JSON_HELP = "Print the findings as a JSON list."
DRAIN_HELP = "Drain this node on a critical finding; resume it when clean (own drains only)."
SUMMARY = "Run the checks once; exit 0 ok, 1 warning, 2 critical, 3 unknown."
# `no_verdict` (finding.py): a crashed check or an unreadable source said nothing about the
# node; the controller's clean-report count asks the same predicate


def configure_logging(verbose: int) -> None:
    """`-v` info, `-vv` debug, else warnings only: the same for every command."""
    import logging

    level = logging.WARNING - 10 * min(verbose, 2)
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def json_text(data: Any) -> str:
    """Machine output: one JSON document (the format of every `--json`)."""
    import json  # only for --json: the HealthCheckProgram prints a table

    return json.dumps(data, indent=2, sort_keys=True, default=str)


def drain_summary(findings: list[Finding]) -> str:
    crit = [f for f in findings if f.severity is Severity.CRITICAL]
    first = crit[0]
    more = f" (+{len(crit) - 1} more)" if len(crit) > 1 else ""
    return f"{first.check}: {first.message}{more}"


def run(cfg: Config, only: str, as_json: bool, slurm_drain: bool) -> int:
    """Run the checks once, print them, drain/resume when asked; the Nagios exit code."""
    from babysitter.checks import nvml
    from babysitter.checks.all import invasive_named, select_checks
    from babysitter.checks.base import Check, CheckContext
    from babysitter.checks.oneshot import BUDGET_S, run_once

    wanted = [w.strip() for w in only.split(",") if w.strip()]
    ctx = CheckContext(cfg, cfg.agent.node_name)
    invasive = invasive_named(ctx, wanted) if wanted else []
    # the default set reads NVML through the small ctypes binding (pynvml's import alone is
    # half of NHC's whole run); an invasive test (SDC, NCCL) takes seconds and numpy anyway,
    # and asks NVML more than the lite binding offers
    nvml.use("pynvml" if invasive else "lite")
    chosen: list[Check] = []

    def select() -> list[Check]:
        checks = select_checks(ctx, wanted or None)
        if wanted and not checks:
            raise UsageError(f"--only {only!r} matches no check")
        chosen.extend(checks)
        return checks

    # the 10 s budget is the HealthCheckProgram's, which runs the default set; a run that names
    # an invasive check (an SDC test from an Epilog or a job) gets that check's own timeout
    budget = max([BUDGET_S, *invasive])
    once = run_once(select, budget)
    results = once.results
    # a one-shot run shows at once what an agent sends once (an SDC run's summary)
    findings = [f for r in results for f in r.findings] + [
        f for c in chosen for f in c.take_events()
    ]
    unknown = any(r.unknown for r in results) or any(no_verdict(f) for f in findings)
    code = exit_code(findings, unknown=unknown)
    if as_json:
        print(json_text([f.to_json_dict() for f in findings]))
    else:
        _print_table(findings)
    if slurm_drain and not _slurm_drain(cfg, cfg.agent.node_name, findings, unknown):
        # the verdict did not reach Slurm: never exit 0 for it (critical stays critical)
        code = max(code, EXIT_UNKNOWN) if code != EXIT_CRITICAL else code
    if once.hung:
        # threads stuck in a driver call never return, and interpreter exit would wait on
        # them (and on NVML's shutdown): leave now that the verdict is out
        leave(code)
    nvml.shutdown()  # every check has returned: release the driver (the process may _exit)
    return code


def leave(code: int) -> NoReturn:
    """End the process with `code` once the verdict is out, without the interpreter's
    teardown: the one-shot's output is flushed here and it holds no other buffer, and freeing
    every module at exit is a sixth of the CPU a HealthCheckProgram run costs (and would wait
    for threads hung in the driver)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe: the verdict is the exit code
            pass
    if "logging" in sys.modules:
        sys.modules["logging"].shutdown()
    os._exit(code)


_STYLE = {
    Severity.CRITICAL: "bold red",
    Severity.WARNING: "yellow",
    Severity.INFO: "cyan",
    Severity.OK: "green",
}


def _print_table(findings: list[Finding]) -> None:
    problems = [f for f in findings if f.severity is not Severity.OK]
    healthy = {(f.check, f.component) for f in findings if f.severity is Severity.OK}
    if not sys.stdout.isatty():
        # Slurm's HealthCheckProgram, a pipe, a log: one line per problem, no rich (whose
        # import alone is more memory than the checks)
        for f in sorted(problems, key=lambda f: (-f.severity.rank, f.check, f.component)):
            line = (f.severity, f.check, f.component, f.code, f.message)
            print("  ".join(_plain(c) for c in line))
        print(f"{len(healthy)} check/component pairs ok; worst: {worst(findings)}")
        return
    from babysitter.cli.tables import literal, show, table

    out: list[object] = []
    if problems:
        cells = [
            [literal(f.severity, _STYLE[f.severity]), f.check, f.component, f.code, f.message]
            for f in sorted(problems, key=lambda f: (-f.severity.rank, f.check, f.component))
        ]
        out.append(table("severity", "check", "component", "code", "message", rows=cells))
    out.append(
        f"{len(healthy)} check/component pairs ok; worst: {worst(findings)} "
        "(--json for every finding)"
    )
    show(*out)


def _plain(value: object) -> str:
    """A cell as one line of printable text (messages carry what nodes and drivers wrote)."""
    return "".join(ch if ch.isprintable() else "?" for ch in str(value))


def _say(text: str) -> None:
    print(text, file=sys.stderr)


def _slurm_drain(cfg: Config, node: str, findings: list[Finding], unknown: bool) -> bool:
    """Drain on critical, resume this mode's own drain when every check gave a verdict and none
    is critical. False when Slurm could not be updated (logged to syslog: Slurm discards this
    program's stderr)."""
    # the Slurm client only when asked to drain
    from babysitter.cli.hclog import healthcheck_log
    from babysitter.slurm.client import SlurmError, SlurmNotOwned
    from babysitter.slurm.factory import make_client
    from babysitter.slurm.ownership import HEALTHCHECK_MARK, ReasonOwner, reason_owner

    log = healthcheck_log(cfg.agent.syslog_socket)
    try:
        client = make_client(cfg)
        client.acting_as = ReasonOwner.HEALTHCHECK  # it changes only this mode's own drains
        current = client.node(node)
        held = current.drained_or_draining or current.down
        owner = reason_owner(current.reason, cfg.slurm.reason_prefix)
        mine = owner is ReasonOwner.HEALTHCHECK
        if worst(findings) is Severity.CRITICAL:
            if held and owner in (ReasonOwner.AUTOMATIC, ReasonOwner.MANUAL):
                # the controller's drain stays the controller's (never rewritten as ours)
                log.info("left %s alone: drained by the babysitter controller", node)
                return True
            client.drain(node, f"{HEALTHCHECK_MARK} {drain_summary(findings)}")
            log.warning("drained %s: %s", node, drain_summary(findings))
        elif held and mine and unknown:
            # a check that crashed or hung said nothing about the node: not a clean run
            failed = sorted({f.check for f in findings if no_verdict(f)})
            log.warning("kept %s drained: no verdict from %s", node, ", ".join(failed) or "a check")
        elif held and mine:
            client.resume(node)
            log.info("resumed %s", node)
        elif held and current.reason:
            log.info("left %s alone: not drained by this check (%r)", node, current.reason)
    except SlurmNotOwned as exc:
        log.info("left %s alone: %s", node, exc)
    except (SlurmError, OSError) as exc:
        log.error("could not update Slurm for %s: %s", node, exc)
        return False
    return True


def _parser() -> argparse.ArgumentParser:
    import argparse

    p = argparse.ArgumentParser(prog="babysitter", add_help=True)
    p.add_argument("--config", dest="config_path", default=None)
    p.add_argument("-v", "--verbose", action="count", default=0)
    p.add_argument("--version", action="version", version=f"babysitter, version {__version__}")
    sub = p.add_subparsers(dest="command", required=True)
    c = sub.add_parser("check", help=SUMMARY, description=SUMMARY)
    c.add_argument("--only", default="", help=ONLY_HELP)
    c.add_argument("--json", dest="as_json", action="store_true", help=JSON_HELP)
    c.add_argument("--slurm-drain", action="store_true", help=DRAIN_HELP)
    return p


def is_check(argv: Sequence[str]) -> bool:
    """True when the command line is `babysitter [--config X] [-v...] check ...`."""
    i = 0
    while i < len(argv):
        a = argv[i]
        if a == "--config":
            i += 2
            continue
        if a.startswith("--config=") or a in ("-v", "-vv", "--verbose"):
            i += 1
            continue
        return a == "check"
    return False


_FLAGS = {"--json": "as_json", "--slurm-drain": "slurm_drain"}
_VALUES = {"--config": "config_path", "--only": "only"}


def simple_args(argv: Sequence[str]) -> SimpleNamespace | None:
    """The arguments of a plain command line (the options above, each once, spelled in full),
    as argparse would give them; None for anything else (help, a typo, -vv...): argparse reads
    those, with its messages."""
    out = SimpleNamespace(
        config_path=None, verbose=0, command="check", only="", as_json=False, slurm_drain=False
    )
    seen: set[str] = set()
    args = list(argv)
    i, command = 0, False
    while i < len(args):
        a = args[i]
        name, eq, value = a.partition("=")
        if a == "check" and not command:
            command = True
        elif name in _VALUES and name not in seen and command == (name == "--only"):
            if not eq:
                i += 1
                if i == len(args) or args[i].startswith("-"):
                    return None
                value = args[i]
            setattr(out, _VALUES[name], value)
            seen.add(name)
        elif a in _FLAGS and command and a not in seen:
            setattr(out, _FLAGS[a], True)
            seen.add(a)
        elif a in ("-v", "--verbose") and not command:
            out.verbose += 1
        else:
            return None
        i += 1
    return out if command else None


def import_msgspec_lean() -> None:
    """Import msgspec without typing_extensions. msgspec imports it when it is installed (the
    controller's pydantic brings it), only to recognise its special forms; it falls back to
    `typing`'s, which are the ones babysitter's types use (no babysitter module imports
    typing_extensions: tests/test_gpu_checks.py). It is 1.7 MB of the one-shot's peak memory.
    Blocked for this one import only: anything imported later gets the real module."""
    if "msgspec" in sys.modules or "typing_extensions" in sys.modules:
        return
    sys.modules["typing_extensions"] = None  # type: ignore[assignment]  # ImportError
    try:
        import msgspec  # noqa: F401
    finally:
        del sys.modules["typing_extensions"]


def main(argv: Sequence[str]) -> int:
    """`babysitter … check …` end to end: parse, load the config, run; the exit code."""
    args: Any = simple_args(argv) or _parser().parse_args(list(argv))
    if args.verbose:
        configure_logging(args.verbose)
    # else logging stays unconfigured (and unimported until something warns): Python's own
    # last-resort handler prints warnings and errors to stderr, as configure_logging(0) would
    try:
        import_msgspec_lean()
        from babysitter.config import load_config

        cfg = load_config(args.config_path)  # else $BABYSITTER_CONFIG, else the default
        return run(cfg, args.only, args.as_json, args.slurm_drain)
    except BabysitterError as exc:
        _say(f"error: {exc}")
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
