"""A newcomer's first commands, timed as they type them: `make test-unit`, `make demo` warm (its
venv and builds already there) to its first drain and to its end, and `make demo` cold: a fresh
clone of this commit with no venv and no build, on a machine whose Debian packages are installed
and whose pip cache is warm (the figure says so). Wall time from the command's start, with the
load average, since the machine is shared.
Run: python -m bench.newcomer [--warm-runs N] [--no-cold]"""

from __future__ import annotations

import argparse
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench.common import REPO, figure, missing, summary, write_result

# the demo's row for the drain (babysitter/demo.py); rich draws its live table on a pipe too
# when told it is a terminal (FORCE_COLOR), so the row is seen when it appears
DRAIN_ROW = "finding -> node drained"
DEMO_OK = re.compile(r"demo ok")


def _cpu_of_children() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def test_unit(repo: Path) -> dict[str, Any]:
    cpu0, t0 = _cpu_of_children(), time.monotonic()
    r = subprocess.run(
        ["make", "--no-print-directory", "test-unit"],
        cwd=repo,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    took = time.monotonic() - t0
    tail = r.stdout.strip().splitlines()[-1] if r.stdout.strip() else ""
    passed = re.search(r"(\d+) passed", tail)
    return {
        "seconds": round(took, 2),
        "cpu_s": round(_cpu_of_children() - cpu0, 2),
        "exit": r.returncode,
        "passed": int(passed[1]) if passed else None,
        "summary": tail,
    }


def demo(repo: Path, timeout: float = 900) -> dict[str, Any]:
    """`make demo` in `repo`: seconds to the drain row and to the end, from the command's start."""
    env = dict(os.environ, FORCE_COLOR="1", COLUMNS="160", LINES="60")
    t0 = time.monotonic()
    proc = subprocess.Popen(
        ["make", "--no-print-directory", "demo"],
        cwd=repo,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    assert proc.stdout is not None
    seen: dict[str, float] = {}
    out: list[bytes] = []
    timer = threading.Timer(timeout, proc.kill)  # a stuck demo ends the measurement
    timer.start()
    try:
        for chunk in iter(lambda: proc.stdout.read1(65536), b""):  # type: ignore[union-attr]
            out.append(chunk)
            if "drain" not in seen and DRAIN_ROW.encode() in b"".join(out[-2:]):
                seen["drain"] = time.monotonic() - t0
        proc.wait()
    finally:
        timer.cancel()
    text = b"".join(out).decode(errors="replace")
    return {
        "first_drain_s": round(seen["drain"], 2) if "drain" in seen else None,
        "total_s": round(time.monotonic() - t0, 2),
        "exit": proc.returncode,
        "ok": proc.returncode == 0 and bool(DEMO_OK.search(text)),
        "tail": text[-400:] if proc.returncode else "",
    }


def cold_demo() -> dict[str, Any]:
    """A fresh clone of HEAD (no .venv, no build of the fake NVML library or the plugins)."""
    d = Path(tempfile.mkdtemp(prefix="bs-newcomer-"))
    try:
        subprocess.run(["git", "clone", "-q", str(REPO), str(d / "repo")], check=True, timeout=120)
        return demo(d / "repo")
    finally:
        shutil.rmtree(d, ignore_errors=True)


def _figures(unit: dict[str, Any], warm: list[dict[str, Any]], cold: dict[str, Any] | None):
    figs = [
        figure(
            "make test-unit, wall time",
            unit["seconds"],
            "s",
            goal="<= 30 s",
            met=unit["exit"] == 0 and unit["seconds"] <= 30,
            tests=unit["passed"],
        ),
        # the wall time follows the load of a shared machine; the CPU it costs does not
        figure("make test-unit, CPU time of all its processes", unit["cpu_s"], "s"),
    ]
    drains = [w["first_drain_s"] for w in warm if w["ok"] and w["first_drain_s"] is not None]
    totals = [w["total_s"] for w in warm if w["ok"]]
    if drains:
        s = summary(drains)
        figs.append(
            figure(
                "make demo, warm: start -> first drain (p50)",
                s["p50"],
                "s",
                goal="<= 30 s",
                met=s["p50"] <= 30,
                p99=s["p99"],
                spread=s["spread"],
                n=s["n"],
            )
        )
        figs.append(figure("make demo, warm: start -> end (p50)", summary(totals)["p50"], "s"))
    else:
        figs.append(missing("make demo, warm: start -> first drain (p50)", "s", "no run drained"))
    if cold is None:
        figs.append(missing("make demo, cold: start -> first drain", "s", "not run (--no-cold)"))
    elif cold["ok"] and cold["first_drain_s"] is not None:
        figs.append(
            figure(
                "make demo, cold (fresh clone and venv; apt packages installed, pip cache warm): "
                "start -> first drain",
                cold["first_drain_s"],
                "s",
                goal="<= 120 s",
                met=cold["first_drain_s"] <= 120,
                total_s=cold["total_s"],
            )
        )
    else:
        figs.append(missing("make demo, cold: start -> first drain", "s", "the cold demo failed"))
    return figs


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="bench.newcomer")
    ap.add_argument("--warm-runs", type=int, default=3)
    ap.add_argument("--no-cold", action="store_true")
    args = ap.parse_args(argv)
    t0 = time.monotonic()
    subprocess.run(["make", "--no-print-directory", "venv-demo"], cwd=REPO, check=True)
    warm = [demo(REPO) for _ in range(args.warm_runs)]
    cold = None if args.no_cold else cold_demo()
    unit = test_unit(REPO)
    figs = _figures(unit, warm, cold)
    write_result(
        "newcomer",
        figs,
        {"test_unit": unit, "warm_demos": warm, "cold_demo": cold},
        settings={"warm_runs": args.warm_runs, "cold": not args.no_cold},
        duration_s=round(time.monotonic() - t0, 1),
    )
    for f in figs:
        print(f)
    return 0 if all(w["ok"] for w in warm) and unit["exit"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
