"""The SDC test child (`python -m babysitter.checks.sdc.worker`, started by child.run_child):
one `ChildRequest` on stdin, one `ChildReply` on stdout, then it exits and gives back every
GPU context and byte the test took. Anything a library prints goes to stderr: the original
stdout carries only the reply."""

from __future__ import annotations

import ctypes
import os
import resource
import signal
import sys
from pathlib import Path

import msgspec

from babysitter.checks.sdc.child import ChildReply, ChildRequest, DeviceSummary, encode

PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """SIGKILL when the thread that started this process ends (an agent killed mid-test)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass  # not Linux: the parent's timeout still bounds the test


def _reply(req: ChildRequest) -> ChildReply:
    from babysitter.checks.sdc.backends import BackendUnavailable
    from babysitter.checks.sdc.runner import run_sdc

    try:
        res = run_sdc(
            req.backend,
            req.size,
            req.dtype,
            req.seed,
            replicas=req.replicas,
            inject=req.inject,
            state_dir=Path(req.state_dir) if req.state_dir else None,
            check_name=req.check_name,
        )
    except BackendUnavailable as exc:
        return ChildReply(ok=False, error="backend_unavailable", message=str(exc)[:1000])
    except Exception as exc:  # a bug, a CUDA error, bad input: no verdict, said why
        return ChildReply(ok=False, error="failed", message=f"{type(exc).__name__}: {exc}"[:1000])
    return ChildReply(
        ok=True,
        backend=res.backend,
        library=res.library,
        dtype=res.dtype,
        size=res.size,
        devices=[DeviceSummary(r.device, r.label, r.model, float(r.gflops)) for r in res.devices],
        findings=[f.to_json_dict() for f in res.findings],
    )


def main() -> int:
    _die_with_parent()
    reply_fd = os.dup(1)
    os.dup2(2, 1)  # C libraries printing to fd 1 must not corrupt the reply
    sys.stdout = sys.stderr
    try:
        req = msgspec.json.decode(sys.stdin.buffer.read(), type=ChildRequest)
    except msgspec.DecodeError as exc:
        print(f"invalid request: {exc}", file=sys.stderr)
        return 2
    if req.self_timeout_s > 0:
        signal.alarm(max(1, int(req.self_timeout_s)))  # default action: the process ends
    reply = _reply(req)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # kB on Linux
    reply = msgspec.structs.replace(reply, peak_rss_kb=int(peak))
    with os.fdopen(reply_fd, "wb") as out:
        out.write(encode(reply))
    return 0


if __name__ == "__main__":
    sys.exit(main())
