"""Checkpoint discovery, heartbeat reads and resume.json writes run AS THE JOB'S OWNER.

The controller runs as root; a job's checkpoint directory belongs to a user who can put links,
FIFOs, huge files and other users' paths in it. So everything that touches it runs in a
short-lived helper process with the owner's uid, gid and supplementary groups: what the job
cannot read, babysitter cannot use for it, and what the job cannot write, babysitter does not
write. The helper limits itself (address space, CPU time, file size, open files) before it
touches a user path, the controller kills it after a wall-time limit, and its answer is one
bounded JSON document on a pipe that the controller validates like any other untrusted input.

Why a helper command (a fresh `python -I -S -c ...` that drops to the owner itself) and not a
bare fork() of the controller: the controller is multi-threaded (uvicorn, the ingest writer,
the policy loop). A fork() of a threaded process copies locks held by other threads (logging,
the allocator, SQLite) in their held state, and Python documents `preexec_fn` as unsafe with
threads. The helper is a new single-threaded interpreter started from the controller's own
(root-only) installation: it limits itself (RLIMIT_AS, RLIMIT_CPU, RLIMIT_FSIZE,
RLIMIT_NOFILE, no core), reads its request from the controller, calls setgroups/setresgid/
setresuid, checks that root cannot be regained, and only then touches a user path. Dropping
inside the helper (rather than subprocess's user=) means the owner never needs to be able to
execute the controller's Python, and the kernel marks the process non-dumpable after the
switch, so the owner cannot ptrace it and forge its answer. The price is an interpreter start
per call: about 0.1 s of CPU here (0.1-0.6 s wall on the loaded 2-core test machine). Calls
are one per requeue, and one per hang check of a babysat job with hang_timeout, at most every
hang_timeout/10 s.

When the controller itself is not root, the helper runs as the controller's user (it has no
rights to give away), with the same limits.
"""

from __future__ import annotations

import codecs
import json
import math
import os
import pwd
import resource
import selectors
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from babysitter.checkpoints import safefs
from babysitter.checkpoints.discover import discover
from babysitter.checkpoints.resume import STATE_DIR, write_resume_json

WALL_S = 20.0  # the controller kills the helper after this
CPU_S = 15
ADDRESS_SPACE = 1 << 30  # interpreter + zip central directories + a 64 KiB JSON
FILE_SIZE = 1 << 20  # it writes resume.json only
OUT_CAP = 1 << 20
IN_CAP = 64 * 1024
TEXT_CAP = 4000
PATH_CAP = 4096
_PKG_ROOT = str(Path(__file__).resolve().parents[2])


@dataclass(frozen=True)
class Owner:
    name: str
    uid: int
    gid: int
    groups: tuple[int, ...]


def owner_of(user: str) -> Owner | None:
    """The job owner's credentials from the user database; None when unknown."""
    try:
        pw = pwd.getpwnam(user) if not user.isascii() or not user.isdigit() else None
        if pw is None:
            pw = pwd.getpwuid(int(user))
        groups = tuple(os.getgrouplist(pw.pw_name, pw.pw_gid))
    except (KeyError, ValueError, OSError):
        return None
    return Owner(pw.pw_name, pw.pw_uid, pw.pw_gid, groups)


def clean(value: object, cap: int = TEXT_CAP) -> str:
    """User-controlled text made safe to store and show: no lone surrogates (names that are not
    UTF-8 come back backslash-escaped), no NUL, bounded."""
    s = str(value).encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    s = s.replace("\0", "\\0")
    return s if len(s) <= cap else s[: cap - 1] + "…"


# ---------------------------------------------------------------- controller side


class HelperError(Exception):
    pass


def run_helper(
    request: dict[str, Any], owner: Owner | None, wall_s: float = WALL_S
) -> dict[str, Any]:
    """Run one request in the helper as `owner` (None: as this process) and return its
    answer. Raises HelperError (timed out, killed by a limit, oversized or invalid answer)."""
    if owner is not None and os.geteuid() == 0:
        request = {
            **request,
            "creds": {"uid": owner.uid, "gid": owner.gid, "groups": list(owner.groups)},
        }
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); "
        "from babysitter.checkpoints.owner import helper_main; helper_main()"
    )
    proc = subprocess.Popen(
        [sys.executable, "-I", "-S", "-B", "-c", code, _PKG_ROOT],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        cwd="/",
        env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"},
        close_fds=True,
    )
    assert proc.stdin is not None and proc.stdout is not None
    try:
        proc.stdin.write(json.dumps(request).encode())
        proc.stdin.close()
    except BrokenPipeError:
        pass
    out = bytearray()
    deadline = time.monotonic() + wall_s
    try:
        with selectors.DefaultSelector() as sel:
            sel.register(proc.stdout, selectors.EVENT_READ)
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise HelperError(f"timed out after {wall_s:g} s")
                if not sel.select(left):
                    continue
                chunk = os.read(proc.stdout.fileno(), 65536)
                if not chunk:
                    break
                out += chunk
                if len(out) > OUT_CAP:
                    raise HelperError(f"answer over {OUT_CAP} bytes")
        rc = proc.wait(timeout=max(0.1, deadline - time.monotonic()))
    except (HelperError, subprocess.TimeoutExpired) as exc:
        proc.kill()
        proc.wait()
        raise HelperError(str(exc) or "timed out") from None
    finally:
        proc.stdout.close()
    try:
        doc = json.loads(out)
    except (ValueError, RecursionError):
        raise HelperError(f"no answer (exit code {rc})") from None
    if not isinstance(doc, dict):
        raise HelperError("invalid answer")
    return doc


@dataclass
class Outcome:
    resume_point: str | None
    explanation: str
    step: int | None = None
    format: str | None = None


def prepare_resume(
    ckpt: str,
    user: str | None,
    job_id: int,
    restart_count: int,
    settle_s: float,
    wall_s: float = WALL_S,
) -> Outcome:
    """Find the newest complete checkpoint as the job's owner and write its resume.json there.
    Never raises: every failure becomes the explanation (and the job restarts from scratch)."""
    owner = None
    if user is not None:
        owner = owner_of(user)
        if owner is None:
            return Outcome(
                None,
                f"job owner {clean(user, 64)!r} unknown here: checkpoints not read, "
                "restarts from scratch",
            )
    req = {
        "op": "discover",
        "ckpt": ckpt,
        "settle_s": settle_s,
        "job_id": job_id,
        "restart_count": restart_count,
        "write": True,
    }
    try:
        doc = run_helper(req, owner, wall_s)
    except (HelperError, OSError) as exc:
        return Outcome(None, f"checkpoint helper failed ({clean(exc, 200)}): restarts from scratch")
    if doc.get("ok") is not True:
        return Outcome(
            None, f"cannot read checkpoints in {clean(ckpt, 300)}: {clean(doc.get('error'), 500)}"
        )
    choice = doc.get("choice")
    explanation = clean(doc.get("explanation", ""))
    if not isinstance(choice, dict) or not isinstance(choice.get("path"), str):
        if doc.get("unknown") is True:
            # the budget ran out before any complete checkpoint was verified: said as such,
            # never passed off as "there is none" (docs/jobs.md)
            return Outcome(None, f"{explanation}: resume point unknown, no resume.json written")
        return Outcome(None, f"{explanation}: restarts from scratch")
    step = choice.get("step")
    fmt = choice.get("format")
    step_i = step if type(step) is int else None
    fmt_s = clean(fmt, 32) if isinstance(fmt, str) else None
    if doc.get("write_error"):
        return Outcome(
            None,
            f"found {clean(choice['path'], PATH_CAP)} but resume.json not written: "
            f"{clean(doc['write_error'], 500)}; restarts from scratch unless the job finds its "
            "checkpoint itself",
            step_i,
            fmt_s,
        )
    return Outcome(clean(choice["path"], PATH_CAP), explanation, step_i, fmt_s)


def heartbeat_age(
    ckpt: str, user: str | None, job_id: int, now_ts: float, wall_s: float = WALL_S
) -> float | None:
    """Seconds since the job's last progress signal, read as the job's owner; None when there
    is none or it cannot be read."""
    owner = None
    if user is not None:
        owner = owner_of(user)
        if owner is None:
            return None
    try:
        doc = run_helper(
            {"op": "heartbeat", "ckpt": ckpt, "job_id": job_id, "now": now_ts}, owner, wall_s
        )
    except (HelperError, OSError):
        return None
    age = doc.get("age")
    if isinstance(age, int | float) and not isinstance(age, bool) and math.isfinite(age):
        return float(age)
    return None


# ---------------------------------------------------------------- helper side (as the owner)


def _limit_self() -> None:
    for res, value in (
        (resource.RLIMIT_AS, ADDRESS_SPACE),
        (resource.RLIMIT_CPU, CPU_S),
        (resource.RLIMIT_FSIZE, FILE_SIZE),
        (resource.RLIMIT_CORE, 0),
        (resource.RLIMIT_NOFILE, 64),
    ):
        _soft, hard = resource.getrlimit(res)
        new = value if hard == resource.RLIM_INFINITY else min(value, hard)
        resource.setrlimit(res, (new, new))


def _heartbeat(ckpt: str, job_id: int, now: float) -> dict[str, Any]:
    try:
        rootfd = safefs.open_root(ckpt)
    except OSError as exc:
        return {"ok": True, "age": None, "source": f"cannot open {ckpt}: {safefs.why(exc)}"}
    try:
        try:
            dfd = safefs.open_dir(rootfd, STATE_DIR)
            try:
                data = safefs.read_capped(
                    dfd, f"heartbeat-{int(job_id)}.json", safefs.HEARTBEAT_CAP
                )
            finally:
                os.close(dfd)
            t = json.loads(data)["time"]
            if type(t) in (int, float) and math.isfinite(t):
                return {"ok": True, "age": now - t, "source": "heartbeat file"}
            note = "heartbeat time is not a number"
        except (OSError, safefs.Refused, ValueError, KeyError, TypeError, RecursionError) as exc:
            note = safefs.why(exc) if isinstance(exc, OSError) else str(exc)
        try:
            newest = safefs.newest_mtime(rootfd, safefs.Budget())
        except safefs.GaveUp as g:
            return {"ok": True, "age": None, "source": f"no heartbeat ({note}); {g}"}
        except OSError as exc:
            return {"ok": True, "age": None, "source": safefs.why(exc)}
        if newest is None:
            return {"ok": True, "age": None, "source": f"no heartbeat ({note}), no files"}
        return {"ok": True, "age": now - newest, "source": f"newest file (no heartbeat: {note})"}
    finally:
        os.close(rootfd)


def _discover(req: dict[str, Any]) -> dict[str, Any]:
    ckpt = str(req["ckpt"])
    try:
        scan = discover(ckpt, float(req.get("settle_s", 0.0)))
    except OSError as exc:
        return {"ok": False, "error": f"cannot open {ckpt}: {safefs.why(exc)}"}
    choice = scan.choice()
    out: dict[str, Any] = {"ok": True, "choice": None, "write_error": None, "unknown": scan.unknown}
    if choice is None:
        out["explanation"] = scan.explain_none()
        return out
    out["choice"] = {"path": str(choice.path), "format": choice.format, "step": choice.step}
    out["explanation"] = choice.explanation
    if req.get("write"):
        try:
            write_resume_json(ckpt, choice, int(req["job_id"]), int(req["restart_count"]))
        except safefs.Refused as exc:
            out["write_error"] = str(exc)
        except OSError as exc:
            out["write_error"] = f"{STATE_DIR}: {safefs.why(exc)}"
    return out


def _become(creds: dict[str, Any]) -> None:
    """setgroups/setgid/setuid to the job's owner, for good (real, effective and saved ids)."""
    uid, gid = int(creds["uid"]), int(creds["gid"])
    os.setgroups([int(g) for g in creds["groups"]][:256])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)
    if uid != 0:
        try:
            os.setuid(0)
        except PermissionError:
            pass
        else:
            raise SystemExit("could regain root after dropping privileges")
    if os.getresuid() != (uid, uid, uid) or os.getresgid() != (gid, gid, gid):
        raise SystemExit("credentials did not change")


def helper_main() -> None:
    """Entry point of the helper process: limit, become the job's owner, answer one request."""
    # load now what is otherwise loaded lazily (zip member names are cp437): after the switch
    # the owner may not be able to read the interpreter's library
    for enc in ("cp437", "utf-8", "ascii", "latin-1"):
        codecs.lookup(enc)
    _limit_self()
    try:
        req = json.loads(sys.stdin.buffer.read(IN_CAP))
        if req.get("creds") is not None:
            _become(req["creds"])
        if req.get("op") == "discover":
            ans = _discover(req)
        elif req.get("op") == "heartbeat":
            ans = _heartbeat(str(req["ckpt"]), int(req["job_id"]), float(req["now"]))
        else:
            ans = {"ok": False, "error": "unknown op"}
    except MemoryError:
        ans = {"ok": False, "error": "memory limit reached"}
    except Exception as exc:  # the answer must always be one JSON document
        ans = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:TEXT_CAP]}
    sys.stdout.write(json.dumps(ans))
    sys.stdout.flush()
