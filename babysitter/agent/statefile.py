"""The agent's small state files beside its spool (event findings kept until a reboot, the
orders it has taken): written whole and atomically, so a crash leaves the old file or the new,
never half of one."""

from __future__ import annotations

import json
import logging
import os
import tempfile
from pathlib import Path

log = logging.getLogger(__name__)


def write_atomically(path: Path, body: str, what: str) -> bool:
    """Write `body` to `path` through a synced temporary file and a rename; False (logged with
    `what`) when it could not: the caller keeps its state in memory and tries again later."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}-")
    except OSError as exc:
        log.warning("cannot persist %s to %s: %s", what, path, exc)
        return False
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(body)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
        return True
    except OSError as exc:
        log.warning("cannot persist %s to %s: %s", what, path, exc)
        try:
            os.unlink(tmp)
        except OSError:
            pass
        return False


def read_json(path: Path) -> object | None:
    """The state file's JSON; None when there is none yet or it cannot be read (logged): the
    caller starts from nothing, as on a first start."""
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        log.warning("ignoring unreadable %s: %s", path, exc)
        return None
