"""Process helpers for the devcluster: pid files, marker-tagged processes, zombies as dead."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterable
from pathlib import Path

MARKER = "BABYSITTER_DEVCLUSTER"


def alive(pid: int) -> bool:
    """True for a live process; a zombie (PID 1 here reaps slowly) counts as dead."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return False
    # state is the field after the parenthesised command name
    state = stat.rsplit(")", 1)[-1].split()[0] if ")" in stat else "?"
    return state not in ("Z", "X")


def command_name(pid: int) -> str:
    """The process's name (/proc/<pid>/comm), "" when it is gone."""
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def read_pid(pidfile: Path) -> int | None:
    try:
        return int(pidfile.read_text().strip())
    except (OSError, ValueError):
        return None


def marked_pids(marker_value: str) -> list[int]:
    """Processes whose environment carries MARKER=<marker_value> (daemons and slurmstepd)."""
    needle = f"{MARKER}={marker_value}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            env = (entry / "environ").read_bytes()
        except OSError:
            continue
        if needle in env.split(b"\0"):
            found.append(int(entry.name))
    return found


def cwd_pids(under: Path) -> list[int]:
    """Processes whose working directory is under `under` (24.11+ slurmstepd clears its env)."""
    found = []
    prefix = str(under.resolve())
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cwd = os.readlink(entry / "cwd")
        except OSError:
            continue
        if cwd == prefix or cwd.startswith(prefix + "/"):
            found.append(int(entry.name))
    return found


def terminate(pids: Iterable[int], grace_s: float = 5.0) -> list[int]:
    """SIGTERM, wait up to grace_s, then SIGKILL. Returns pids still alive (should be none)."""
    pids = [p for p in set(pids) if alive(p)]
    for p in pids:
        try:
            os.kill(p, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(alive(p) for p in pids):
        time.sleep(0.05)
    for p in pids:
        if alive(p):
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline and any(alive(p) for p in pids):
        time.sleep(0.05)
    return [p for p in pids if alive(p)]


def with_descendants(pids: Iterable[int]) -> list[int]:
    """pids plus every process below them (job steps and the jobs' own processes, which
    carry neither the marker nor a cwd under the cluster)."""
    import psutil

    out = set(pids)
    for p in list(out):
        try:
            out.update(c.pid for c in psutil.Process(p).children(recursive=True))
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return sorted(out)
