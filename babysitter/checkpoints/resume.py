"""`<ckpt>/.babysitter/resume.json`: written atomically by the controller before a requeue, read
by the SPANK plugin (BABYSIT_RESUME_FROM) and by `babysitter.job.resume_path()`.

    {"path": "/ckpt/step3", "format": "generic", "step": 3, "job_id": 12,
     "restart_count": 1, "written_at": "...", "explanation": "..."}
"""

from __future__ import annotations

import json
import os
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from babysitter.checkpoints.discover import Choice

STATE_DIR = ".babysitter"
RESUME_FILE = "resume.json"


def write_resume_json(
    ckpt_dir: str | Path, choice: Choice, job_id: int, restart_count: int
) -> Path:
    d = Path(ckpt_dir) / STATE_DIR
    d.mkdir(parents=True, exist_ok=True)
    doc = {
        "path": str(choice.path),
        "format": choice.format,
        "step": choice.step,
        "job_id": job_id,
        "restart_count": restart_count,
        "written_at": datetime.now(UTC).isoformat(),
        "explanation": choice.explanation,
    }
    fd, tmp = tempfile.mkstemp(dir=d, prefix=".resume-")
    with os.fdopen(fd, "w") as f:
        json.dump(doc, f, indent=2)
        f.flush()
        os.fsync(f.fileno())
    os.chmod(tmp, 0o644)
    target = d / RESUME_FILE
    os.replace(tmp, target)
    dfd = os.open(d, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)
    return target


def read_resume_json(ckpt_dir: str | Path) -> dict[str, Any] | None:
    p = Path(ckpt_dir) / STATE_DIR / RESUME_FILE
    try:
        doc = json.loads(p.read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) and isinstance(doc.get("path"), str) else None
