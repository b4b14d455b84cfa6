"""The SDC test in a short-lived child process: the agent never imports torch, cupy or numpy
for it and never holds a CUDA context.

Why: torch keeps a CUDA context and its cached memory on every GPU it touched for as long as
its process lives. In the agent that is forever: the agent becomes a compute process on each
GPU (jobs in EXCLUSIVE_PROCESS mode cannot start, `nvidia-smi --gpu-reset` refuses, the busy
guard sees every GPU in use), and its RSS stays ~200 MB higher (measured with torch on the
CPU: 54 -> 252 MB after one test). A child that exits gives all of that back.

The child (`python -m babysitter.checks.sdc.worker`) reads a `ChildRequest` as JSON on stdin
and writes one `ChildReply` as JSON on stdout. The parent bounds it:
- time: killed with its whole process group at `timeout_s` (SIGKILL);
- memory: the RSS of the child and its descendants, read from /proc every `POLL_S`; over
  `max_rss_mb` the group is killed. A poll can miss a spike shorter than `POLL_S`; RLIMIT_AS is
  not used because CUDA reserves terabytes of address space it never touches, so any address
  space limit low enough to matter would break CUDA initialisation on a GPU node;
- its parent's death: the child asks the kernel for SIGKILL when the thread that started it
  ends (PR_SET_PDEATHSIG), so a killed agent leaves no test behind holding the GPUs.
A child that crashed, was killed, or wrote anything but one valid reply is `ChildFailed`:
the caller reports no verdict, never a pass."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any

import msgspec

from babysitter.finding import Finding

WORKER = "babysitter.checks.sdc.worker"
POLL_S = 0.2  # how often the parent reads the child's RSS
MAX_REPLY = 1 << 20  # bytes of stdout read back; a reply is a few KB
STDERR_TAIL = 1500  # bytes of the child's stderr quoted when it failed


class ChildRequest(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    backend: str
    size: int
    dtype: str
    seed: int
    replicas: int = 1
    inject: tuple[int, int, int, int] | None = None
    state_dir: str | None = None
    check_name: str = "sdc"
    # the child dies by itself this long after it starts (in case the parent cannot kill it)
    self_timeout_s: float = 0.0


class DeviceSummary(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    device: str  # the finding component: gpuN or cpu
    label: str  # cuda:0, cpu:0
    model: str
    gflops: float


class ChildReply(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    ok: bool  # the test ran and gave a verdict per device
    # when not ok: "backend_unavailable" (no backend can use these GPUs) or "failed"
    error: str = ""
    message: str = ""
    backend: str = ""
    library: str = ""
    dtype: str = ""
    size: int = 0
    devices: list[DeviceSummary] = []
    findings: list[dict[str, Any]] = []
    peak_rss_kb: int = 0  # the child's own high-water mark (ru_maxrss)


class ChildFailed(Exception):
    """No verdict: the child crashed, was killed, or its reply was not valid."""

    def __init__(self, message: str, timed_out: bool = False) -> None:
        super().__init__(message)
        self.timed_out = timed_out


class ChildResult(msgspec.Struct, frozen=True):
    reply: ChildReply
    findings: list[Finding]  # the reply's findings, validated
    peak_rss_kb: int  # the highest of the child's ru_maxrss and what the parent saw
    duration_s: float


def _encode_hook(obj: Any) -> Any:
    item = getattr(obj, "item", None)  # numpy scalars in finding details
    if callable(item):
        return item()
    raise NotImplementedError(f"cannot encode {type(obj).__name__}")


def encode(obj: Any) -> bytes:
    return msgspec.json.encode(obj, enc_hook=_encode_hook)


def tree_rss_kb(pid: int) -> int:
    """Resident memory (kB) of `pid` and all its descendants; 0 once it is gone."""
    total = 0
    todo, seen = [pid], set()
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        seen.add(p)
        try:
            with open(f"/proc/{p}/status", "rb") as f:
                for line in f:
                    if line.startswith(b"VmRSS:"):
                        total += int(line.split()[1])
                        break
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children", "rb") as f:
                    todo.extend(int(c) for c in f.read().split())
        except (OSError, ValueError):
            continue  # ended meanwhile
    return total


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _tail(f: Any) -> str:
    f.seek(0, os.SEEK_END)
    size = f.tell()
    f.seek(max(0, size - STDERR_TAIL))
    text: str = f.read().decode(errors="replace").strip()
    return " | ".join(line for line in text.splitlines()[-6:] if line.strip())


def validate(reply: ChildReply, req: ChildRequest) -> list[Finding]:
    """The reply's findings; ChildFailed when it does not hold together (a verdict per device,
    all from the requested check)."""
    try:
        findings = [Finding.from_dict(d) for d in reply.findings]
    except ValueError as exc:
        raise ChildFailed(f"the SDC test child sent an invalid finding: {exc}") from None
    if not reply.ok:
        if reply.error not in ("backend_unavailable", "failed") or not reply.message:
            raise ChildFailed(f"the SDC test child sent an unknown error {reply.error!r}")
        return findings
    components = sorted(f.component for f in findings)
    if not reply.devices or components != sorted(d.device for d in reply.devices):
        raise ChildFailed("the SDC test child's reply has no verdict for some device")
    if any(f.check != req.check_name for f in findings):
        raise ChildFailed("the SDC test child's reply names another check")
    return findings


def run_child(
    req: ChildRequest,
    timeout_s: float,
    max_rss_mb: float,
    python: str | None = None,
    env: dict[str, str] | None = None,
) -> ChildResult:
    """Run the SDC test in a child process and wait for it (at most timeout_s)."""
    req = msgspec.structs.replace(req, self_timeout_s=timeout_s + 30.0)
    limit_kb = int(max_rss_mb * 1024)
    started = time.monotonic()
    peak = 0
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        # files, not pipes: nothing to drain while waiting, and the child's output does not
        # grow the agent's memory
        try:
            proc = subprocess.Popen(
                [python or sys.executable, "-m", WORKER],
                stdin=subprocess.PIPE,
                stdout=out,
                stderr=err,
                env=env,
                start_new_session=True,  # its own process group: killed as a whole
                close_fds=True,
            )
        except OSError as exc:  # no interpreter, no memory or pids left for a process
            raise ChildFailed(f"cannot start the SDC test child: {exc}") from None
        try:
            assert proc.stdin is not None
            try:
                proc.stdin.write(encode(req))
                proc.stdin.close()
            except BrokenPipeError:
                pass  # it died at once: the exit status says why
            why, timed_out = "", False
            while True:
                try:
                    proc.wait(timeout=POLL_S)
                    break
                except subprocess.TimeoutExpired:
                    pass
                rss = tree_rss_kb(proc.pid)
                peak = max(peak, rss)
                if rss > limit_kb:
                    why = (
                        f"the SDC test child used {rss // 1024} MB, over [checks.sdc] "
                        f"max_rss_mb = {max_rss_mb:g}: killed"
                    )
                    break
                if time.monotonic() - started >= timeout_s:
                    why, timed_out = (
                        f"the SDC test child did not finish within {timeout_s:g} s: killed",
                        True,
                    )
                    break
        finally:
            # also whatever it started that outlived it: nothing of the test may stay on a GPU
            _kill_group(proc.pid)
            proc.wait()
        duration = time.monotonic() - started
        if why:
            raise ChildFailed(why, timed_out)
        stderr = _tail(err)
        if proc.returncode != 0:
            how = (
                f"killed by signal {-proc.returncode}"
                if proc.returncode < 0
                else f"exited with status {proc.returncode}"
            )
            raise ChildFailed(f"the SDC test child {how}" + (f": {stderr}" if stderr else ""))
        out.seek(0)
        data = out.read(MAX_REPLY + 1)
    if len(data) > MAX_REPLY:
        raise ChildFailed("the SDC test child's reply is too large")
    try:
        reply = msgspec.json.decode(data, type=ChildReply)
    except msgspec.DecodeError as exc:
        raise ChildFailed(f"the SDC test child's reply is not valid: {exc}") from None
    findings = validate(reply, req)
    return ChildResult(reply, findings, max(peak, reply.peak_rss_kb), duration)
