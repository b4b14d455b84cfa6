"""RMA evidence on the node: the controller orders it (loop/heal/rma.py, in its answer to a
report) when the node became a lemon or a reset / reboot rung failed. On a thread of its own the
agent runs `nvidia-bug-report.sh` in an empty temporary directory (bounded in time and size;
not installed: recorded as absent), reads the recent kernel log (bounded), packs both with a
manifest saying what was collected and what was not, and uploads the tar.gz to the controller
(`POST /api/v1/nodes/NODE/rma/ORDER`), which adds the ledger history and the findings."""

from __future__ import annotations

import io
import json
import logging
import os
import signal
import socket
import subprocess
import tarfile
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from babysitter.agent.shipper import tls_verify
from babysitter.config import AgentConfig, RmaConfig

log = logging.getLogger(__name__)

ORDER = "rma.collect"  # the order's `check`
BUG_REPORT = "nvidia-bug-report.log.gz"  # what nvidia-bug-report.sh writes in its directory
KERNEL_LOG_TIMEOUT_S = 30.0
UPLOAD_TRIES = 3


def _run(argv: list[str], cwd: Path | None, timeout_s: float) -> tuple[int | None, bytes, str]:
    """(exit, stdout (bounded by the caller's reading), error); exit None: killed at its timeout
    (the whole process group) or not run (error says which)."""
    with tempfile.TemporaryFile() as out:
        try:
            proc = subprocess.Popen(
                argv,
                cwd=cwd,
                stdout=out,
                stderr=subprocess.DEVNULL,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        except OSError as exc:
            return None, b"", f"not run: {exc.strerror or exc}"
        try:
            code = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                proc.kill()
            proc.wait()
            return None, b"", f"killed after {timeout_s:g} s"
        out.seek(0)
        return code, out.read(8 * 1024 * 1024), ""


def bug_report(rma: RmaConfig, workdir: Path) -> tuple[Path | None, str]:
    """(the report's file, what happened)."""
    code, _, err = _run(rma.bug_report_command, workdir, rma.bug_report_timeout_s)
    name = rma.bug_report_command[0] if rma.bug_report_command else "(none)"
    if err.startswith("not run"):
        return None, f"absent: {name} {err}"
    out = workdir / BUG_REPORT
    if not out.is_file():
        why = err or f"exit {code}"
        return None, f"failed: {name} wrote no {BUG_REPORT} ({why})"
    size = out.stat().st_size
    if size > rma.max_mb * 1024 * 1024:
        return None, f"left out: {size / 1e6:.1f} MB > max_mb {rma.max_mb:g}"
    done = "collected" if not err and code == 0 else f"partial ({err or f'exit {code}'})"
    return out, f"{done}: {size} bytes"


def kernel_log(rma: RmaConfig) -> tuple[bytes, str]:
    """The last kernel_log_lines lines of the kernel log: journalctl, else dmesg."""
    n = rma.kernel_log_lines
    tries = (
        [rma.kernel_log_command]
        if rma.kernel_log_command
        else [["journalctl", "-k", "--no-pager", "-n", str(n)], ["dmesg", "-T"]]
    )
    errors = []
    for argv in tries:
        code, out, err = _run(argv, None, KERNEL_LOG_TIMEOUT_S)
        if code == 0:
            lines = out.splitlines()[-n:]
            return b"\n".join(lines) + b"\n", f"{len(lines)} lines from {argv[0]}"
        errors.append(f"{argv[0]}: {err or f'exit {code}'}")
    return b"", "unknown: " + "; ".join(errors)


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mtime = len(data), int(time.time())
    tar.addfile(info, io.BytesIO(data))


def collect(rma: RmaConfig, node: str, order: str) -> bytes:
    """The node's part of the archive (tar.gz bytes): the bug report, the kernel log and a
    manifest of what each is (absent, failed, left out: said, never silent)."""
    manifest: dict[str, Any] = {"node": node, "host": socket.gethostname(), "order": order}
    buf = io.BytesIO()
    with tempfile.TemporaryDirectory(prefix="babysitter-rma-") as tmp:
        report, manifest["bug_report"] = bug_report(rma, Path(tmp))
        klog, manifest["kernel_log"] = kernel_log(rma)
        manifest["collected_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        with tarfile.open(fileobj=buf, mode="w:gz") as tar:
            if report is not None:
                tar.add(report, arcname=BUG_REPORT)
            _add(tar, "kernel.log", klog)
            _add(tar, "node-manifest.json", json.dumps(manifest, indent=2).encode())
    log.warning("RMA evidence %s: bug report %s; kernel log %s", order, *_what(manifest))
    return buf.getvalue()


def _what(manifest: dict[str, Any]) -> tuple[str, str]:
    return str(manifest["bug_report"]), str(manifest["kernel_log"])


def upload(agent: AgentConfig, order: str, body: bytes, client: httpx.Client | None = None) -> str:
    """POST the node's part; "" when the controller took it, else why not (after retries)."""
    token = agent.token_file.read_text().strip()
    url = f"{agent.controller_url.rstrip('/')}/api/v1/nodes/{agent.node_name}/rma/{order}"
    headers = {
        "Authorization": f"Bearer {token}",
        "X-Babysitter-Node": agent.node_name,
        "Content-Type": "application/gzip",
    }
    http = client or httpx.Client(timeout=60.0, verify=tls_verify(agent.ca_file))
    why = ""
    try:
        for attempt in range(UPLOAD_TRIES):
            try:
                r = http.post(url, content=body, headers=headers)
            except httpx.HTTPError as exc:
                why = f"upload failed: {exc}"
            else:
                if r.status_code < 300:
                    return ""
                why = f"controller answered {r.status_code}: {r.text[:200]}"
                if 400 <= r.status_code < 500 and r.status_code not in (408, 429):
                    return why  # refused for what it is: sending it again changes nothing
            time.sleep(2.0 * (attempt + 1))
    finally:
        if client is None:
            http.close()
    return why


def carry_out(agent: AgentConfig, rma: RmaConfig, order: dict[str, Any]) -> str:
    """Collect and upload; "" or why it failed (the controller then times the order out)."""
    oid = str(order.get("id", ""))[:64]
    try:
        body = collect(rma, agent.node_name, oid)
    except Exception as exc:  # a full disk, a bad tar: the controller still hears nothing
        log.exception("RMA evidence %s: collection failed", oid)
        return f"collection failed: {exc}"
    why = upload(agent, oid, body)
    if why:
        log.warning("RMA evidence %s: %s", oid, why)
    return why


_busy = threading.Lock()


def start(agent: AgentConfig, rma: RmaConfig, order: dict[str, Any]) -> bool:
    """On a thread of its own (minutes of bug report must not hold the shipper); one at a time.
    False: one is running (the controller's order stays open; it asks again)."""
    if not _busy.acquire(blocking=False):
        return False

    def run() -> None:
        try:
            carry_out(agent, rma, order)
        finally:
            _busy.release()

    threading.Thread(target=run, name="rma-evidence", daemon=True).start()
    return True
