"""`<ckpt>/.babysitter/resume.json`: written atomically (as the job's owner, see owner.py) before
a requeue, read by the SPANK plugin (BABYSIT_RESUME_FROM) and by `babysitter.job.resume_path()`.

    {"path": "/ckpt/step3", "format": "generic", "step": 3, "job_id": 12,
     "restart_count": 1, "written_at": "...", "explanation": "..."}

The file is ASCII JSON: non-ASCII path characters are `\\uXXXX` escapes and bytes that are not
UTF-8 are lone surrogates `\\udc80`-`\\udcff` (Python's surrogateescape); the plugin decodes
both back to the exact bytes. `.babysitter` is never followed as a link, and must belong to the
user writing into it.
"""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from babysitter.checkpoints import safefs
from babysitter.checkpoints.discover import Choice

STATE_DIR = ".babysitter"
RESUME_FILE = "resume.json"
RESUME_CAP = 64 * 1024


def write_resume_json(
    ckpt_dir: str | Path, choice: Choice, job_id: int, restart_count: int
) -> Path:
    doc = {
        "path": str(choice.path),
        "format": choice.format,
        "step": choice.step,
        "job_id": job_id,
        "restart_count": restart_count,
        "written_at": datetime.now(UTC).isoformat(),
        "explanation": choice.explanation[:4000],
    }
    data = json.dumps(doc, indent=2).encode("ascii")
    rootfd = safefs.open_root(ckpt_dir)
    try:
        try:
            os.mkdir(STATE_DIR, 0o755, dir_fd=rootfd)
        except FileExistsError:
            pass
        try:
            dfd = safefs.open_dir(rootfd, STATE_DIR)
        except OSError as exc:
            raise safefs.Refused(f"{STATE_DIR} is {safefs.why(exc)}") from None
    finally:
        os.close(rootfd)
    try:
        st = os.fstat(dfd)
        if st.st_uid != os.geteuid():
            raise safefs.Refused(f"{STATE_DIR} belongs to uid {st.st_uid}, not to the job's owner")
        tmp = f".resume-{os.getpid()}-{os.urandom(4).hex()}"
        fd = os.open(
            tmp,
            os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
            0o644,
            dir_fd=dfd,
        )
        try:
            os.fchmod(fd, 0o644)
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, RESUME_FILE, src_dir_fd=dfd, dst_dir_fd=dfd)
        os.fsync(dfd)
    finally:
        os.close(dfd)
    return Path(ckpt_dir) / STATE_DIR / RESUME_FILE


def read_resume_json(ckpt_dir: str | Path) -> dict[str, Any] | None:
    try:
        rootfd = safefs.open_root(ckpt_dir)
    except OSError:
        return None
    try:
        dfd = safefs.open_dir(rootfd, STATE_DIR)
        try:
            doc = json.loads(safefs.read_capped(dfd, RESUME_FILE, RESUME_CAP))
        finally:
            os.close(dfd)
    except (OSError, safefs.Refused, ValueError, RecursionError):
        return None
    finally:
        os.close(rootfd)
    return doc if isinstance(doc, dict) and isinstance(doc.get("path"), str) else None
