"""Where a benchmark figure came from: the machine, the code (commit, and whether the tree held
uncommitted changes), the date, the load on a shared machine, and the settings of the run. Also:
whether a result is older than the code it measures (STALE), so `make bench` never shows an old
figure as if it were today's.

Each benchmark names the paths it measures (MEASURES); a result is stale when a commit touching
any of them is not contained in the commit the result was measured at (or that commit is not in
this repository at all), or when the tree was dirty then (the code measured was never
committed)."""

from __future__ import annotations

import os
import platform
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent

# benchmark result name -> repository paths whose code it measures (its own script included)
MEASURES: dict[str, tuple[str, ...]] = {
    "equivalence": (
        "babysitter",
        "bench/soak.py",
        "bench/equivalence.py",
        "bench/data/equivalence_noise.toml",
    ),
    "tick_cost": ("babysitter/controller", "bench/tick_cost.py", "bench/slurm_standin.py"),
    "sdc": ("babysitter/checks/sdc", "bench/sdc.py"),
    "agent_cost": (
        "babysitter/agent",
        "babysitter/checks",
        "babysitter/cli",
        "bench/agent_cost.py",
    ),
    "fabric_scale": (
        "babysitter/controller/loop/decide/fabric.py",
        "babysitter/slurm/topology.py",
        "bench/fabric_scale.py",
    ),
    "rack_failure": (
        "babysitter/controller",
        "babysitter/slurm",
        "bench/rack_failure.py",
        "bench/bigcluster.py",
    ),
    "slurm_load": (
        "babysitter/controller",
        "babysitter/slurm",
        "bench/slurm_load.py",
        "bench/bigcluster.py",
    ),
    "slurm_load_rest": (
        "babysitter/controller",
        "babysitter/slurm",
        "bench/slurm_load.py",
        "bench/bigcluster.py",
    ),
    "alert_blackhole": (
        "babysitter/controller",
        "bench/alert_blackhole.py",
        "bench/slurm_standin.py",
    ),
    "ingest": (
        "babysitter/controller",
        "babysitter/report.py",
        "babysitter/finding.py",
        "bench/ingest.py",
    ),
    "cockpit": (
        "babysitter/controller",
        "babysitter/config.py",
        "bench/cockpit.py",
        "bench/bigcluster.py",
        "bench/slurm_standin.py",
    ),
    "fault_drain": ("babysitter", "bench/fault_drain.py"),
    "soak": (
        "babysitter/agent",
        "babysitter/checks",
        "babysitter/controller",
        "babysitter/hardware",
        "babysitter/config.py",
        "bench/soak.py",
        "bench/soak_shards.py",
        "bench/soak_alerts.py",
        "bench/slurm_standin.py",
        "bench/nhc_model.py",
        "bench/poisson.py",
        "bench/data/soak_noise.toml",
    ),
    "self_heal": ("babysitter", "bench/self_heal.py"),
    "self_heal_defaults": ("babysitter", "bench/self_heal.py", "bench/self_heal_defaults.py"),
    "ettr": (
        "bench/ettr.py",
        "bench/data/ettr_inputs.toml",
        "babysitter/hardware/xids.py",
        "bench/poisson.py",
    ),
    "nhc": ("babysitter", "bench/nhc.py", "bench/data/nhc_gpu_health.c"),
    "newcomer": (
        "Makefile",
        "pyproject.toml",
        "tests/conftest.py",
        "babysitter/demo.py",
        "babysitter/devcluster",
        "bench/newcomer.py",
    ),
}
# results another benchmark reads: it is stale too when they were measured after it
INPUTS: dict[str, tuple[str, ...]] = {"ettr": ("fault_drain", "soak", "self_heal_defaults")}
# generated files: a tree that differs from HEAD only here is not "dirty" code
GENERATED = ("bench/results/", "bench/RESULTS.md")


def _git(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["git", "-C", str(REPO), *args], capture_output=True, text=True, timeout=30
    )


def machine() -> dict[str, Any]:
    cpu = ""
    mem_gb: float | None = None
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_gb = round(int(line.split()[1]) / 1024**2, 1)  # kB -> GiB
                break
    except (OSError, ValueError):
        pass
    return {
        "hostname": platform.node(),
        "cpu": cpu or "unknown",
        "cores": os.cpu_count(),
        "memory_gib": mem_gb,
        "python": platform.python_version(),
        "kernel": platform.release(),
    }


def load_average() -> list[float]:
    """1, 5 and 15-minute load averages (the machine is shared: timing figures need them)."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []


def source() -> dict[str, Any]:
    """The commit the tree is at and the uncommitted changes to code (not to results)."""
    head = _git("rev-parse", "HEAD").stdout.strip() or "unknown"
    status = _git("status", "--porcelain", "--untracked-files=no").stdout.splitlines()
    changed = sorted(
        p
        for p in (line[3:].split(" -> ")[-1] for line in status if len(line) > 3)
        if not p.startswith(GENERATED)
    )
    return {"commit": head, "dirty": bool(changed), "dirty_paths": changed[:20]}


@dataclass(frozen=True)
class Staleness:
    stale: bool
    why: str


def _latest_change(paths: tuple[str, ...]) -> str | None:
    out = _git("log", "-1", "--format=%H", "--", *paths).stdout.strip()
    return out or None


def staleness(doc: dict[str, Any], others: dict[str, dict[str, Any]] | None = None) -> Staleness:
    """Is this result older than the code it measures (or than the results it reads)?"""
    name = str(doc.get("name", ""))
    recorded = str(doc.get("commit") or "unknown")
    if doc.get("dirty"):
        return Staleness(True, "measured on uncommitted code")
    paths = tuple(doc.get("measures") or MEASURES.get(name, ()))
    if not paths:
        return Staleness(True, "no record of the code it measures")
    if recorded == "unknown" or _git("cat-file", "-e", f"{recorded}^{{commit}}").returncode:
        return Staleness(True, f"commit {recorded[:10]} is not in this repository")
    latest = _latest_change(paths)
    if latest and _git("merge-base", "--is-ancestor", latest, recorded).returncode:
        when = _git("log", "-1", "--format=%h %cs", latest).stdout.strip()
        return Staleness(True, f"code it measures changed since ({when})")
    for dep in INPUTS.get(name, ()):
        other = (others or {}).get(dep)
        if other and str(other.get("date", "")) > str(doc.get("date", "")):
            return Staleness(True, f"its input {dep} was measured again after it")
        if other and staleness(other, others).stale:
            return Staleness(True, f"its input {dep} is STALE")
    return Staleness(False, "")
