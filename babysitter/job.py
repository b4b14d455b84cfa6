"""The job side of babysitter, for training scripts. Standard library only: importing it never
pulls in babysitter's daemon dependencies.

    from babysitter import job
    start = job.resume_path()             # None on a fresh start
    job.heartbeat(step)                   # progress signal for hang detection
    job.mark_checkpoint_complete(path)    # generic checkpoints: the marker is written last
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any, TypedDict, cast

from babysitter.checkpoints.discover import MARKER, find_latest_complete
from babysitter.checkpoints.resume import STATE_DIR, read_resume_json

ENV_RESUME = "BABYSIT_RESUME_FROM"
ENV_CKPT = "BABYSIT_CKPT"
KEYS = ("ckpt", "max_requeues", "hang_timeout")
# AdminComment/Comment are the job owner's text: bounded before anything is parsed. Limits in
# UTF-8 bytes, as the SPANK plugin counts them (slurm-plugins/babysit_spank.c: MAX_ARG - 1,
# MAX_CKPT)
MAX_SPEC_BYTES = 8191
MAX_SCAN_CHARS = 64 * 1024
MAX_PATH_BYTES = 4095  # PATH_MAX less its NUL
MAX_NUMBER = 10**7
PREFIX = "babysit="


class BabysitArgsError(ValueError):
    pass


class BabysitSpec(TypedDict, total=False):
    """The parsed `--babysit` arguments (each key only when given)."""

    ckpt: str
    max_requeues: int
    hang_timeout: int


def parse_babysit_args(text: str) -> BabysitSpec:
    """`ckpt=/abs/dir,max_requeues=3,hang_timeout=1800` (optionally prefixed `babysit=`), the
    value of `--babysit` and of AdminComment/Comment. Same rules as the SPANK plugin
    (slurm-plugins/babysit_spank.c `parse`; tests/test_spank.py feeds both the same generated
    specs): no whitespace anywhere (AdminComment is split on it, so a spec with a space could
    not mean the same on both sides), lengths counted in UTF-8 bytes."""
    if len(text) > len(PREFIX) + MAX_SPEC_BYTES:  # chars <= bytes: cheap bound first
        raise BabysitArgsError(f"--babysit: longer than {MAX_SPEC_BYTES} bytes")
    if text.startswith(PREFIX):
        text = text[len(PREFIX) :]
    elif text == "babysit":
        text = ""
    if _utf8_len(text) > MAX_SPEC_BYTES:
        raise BabysitArgsError(f"--babysit: longer than {MAX_SPEC_BYTES} bytes")
    if any(ch.isspace() for ch in text):
        raise BabysitArgsError("--babysit: no whitespace allowed in the value")
    out: dict[str, Any] = {}
    for part in filter(None, text.split(",")):
        key, sep, val = part.partition("=")
        if not sep or not val:
            raise BabysitArgsError(f"--babysit: '{part}' is not key=value")
        if key not in KEYS:
            raise BabysitArgsError(f"--babysit: unknown key '{key}' (known: {', '.join(KEYS)})")
        if key in out:
            raise BabysitArgsError(f"--babysit: '{key}' given twice")
        if key == "ckpt":
            if not val.startswith("/"):
                raise BabysitArgsError("--babysit: ckpt must be an absolute path")
            if _utf8_len(val) > MAX_PATH_BYTES or "\x00" in val:
                raise BabysitArgsError("--babysit: ckpt is not a usable path")
            out[key] = val
        else:
            # ASCII digits only: str.isdigit() is also true for '²' or '٣', which int()
            # refuses or reads as another number; a handful of digits bounds int()'s work
            if not (val.isascii() and val.isdigit()) or len(val) > 8:
                raise BabysitArgsError(
                    f"--babysit: {key} must be an integer from 0 to {MAX_NUMBER}"
                )
            n = int(val)
            if key == "hang_timeout" and n == 0:
                raise BabysitArgsError("--babysit: hang_timeout must be > 0")
            if n > MAX_NUMBER:
                raise BabysitArgsError(f"--babysit: {key} is too large")
            out[key] = n
    return cast(BabysitSpec, out)


def _utf8_len(text: str) -> int:
    # a name that is not UTF-8 arrives as lone surrogates (surrogateescape): one byte each
    try:
        return len(text.encode("utf-8", "surrogateescape"))
    except UnicodeEncodeError:  # other lone surrogates: as many bytes as they would take
        return len(text.encode("utf-8", "surrogatepass"))


def babysit_spec(admin_comment: str, comment: str = "") -> BabysitSpec | None:
    """The job's babysit arguments from AdminComment (plugin) or Comment (fallback); None when
    the job did not opt in or its arguments are invalid."""
    for text in (admin_comment, comment):
        for token in (text or "")[:MAX_SCAN_CHARS].split():
            if token == "babysit" or token.startswith("babysit="):
                try:
                    return parse_babysit_args(token)
                except BabysitArgsError:
                    return None
    return None


def _ckpt_dir(ckpt: str | os.PathLike[str] | None) -> Path | None:
    d = ckpt or os.environ.get(ENV_CKPT)
    return Path(d) if d else None


def resume_path(ckpt: str | os.PathLike[str] | None = None) -> str | None:
    """Where to resume from: $BABYSIT_RESUME_FROM (set by the plugin on restart), else the
    controller's resume.json, else the newest complete checkpoint; None on a fresh start."""
    env = os.environ.get(ENV_RESUME)
    if env and Path(env).exists():
        return env
    d = _ckpt_dir(ckpt)
    if d is None:
        return None
    doc = read_resume_json(d)
    if doc and Path(doc["path"]).exists():
        return str(doc["path"])
    choice = find_latest_complete(d)
    return str(choice.path) if choice else None


def _atomic_write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}-")
    with os.fdopen(fd, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def heartbeat(step: int, ckpt: str | os.PathLike[str] | None = None) -> None:
    """Progress signal read by babysitter's hang detection; cheap enough to call every step.
    Best effort: a signal that cannot be written (a full disk, a state directory that is not
    the job's) never stops training."""
    d = _ckpt_dir(ckpt)
    if d is None:
        return
    job = os.environ.get("SLURM_JOB_ID", "local")
    try:
        _atomic_write(
            d / STATE_DIR / f"heartbeat-{job}.json",
            json.dumps({"step": int(step), "time": time.time(), "job_id": job}),
        )
    except OSError:
        pass


def mark_checkpoint_complete(path: str | os.PathLike[str]) -> None:
    """Call after every file of a checkpoint is written and closed."""
    p = Path(path)
    if not p.is_dir():
        raise NotADirectoryError(f"{p} is not a checkpoint directory")
    _atomic_write(p / MARKER, "")
