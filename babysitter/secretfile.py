"""Files that hold secrets (cluster secret, tokens, TLS keys): read only when no other local
user can read or change them, written private from the start. Used by the controller, the
agent and the CLI."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from babysitter.errors import ConfigError


def check_private(path: Path, what: str) -> None:
    """Refuse a secret that other local users can read or change (like ssh does with keys):
    any of them could then impersonate a node or the admin."""
    try:
        st = os.stat(path)
    except OSError as exc:
        raise ConfigError(f"cannot read {what} {path}: {exc.strerror}") from None
    if st.st_mode & 0o077:
        mode = stat.S_IMODE(st.st_mode)
        raise ConfigError(
            f"{what} {path} has mode {mode:04o}: it must not be accessible by group or others "
            f"(chmod 600 {path})"
        )


def write_private(path: Path, text: str) -> None:
    """Write a secret readable by its owner only: created 0600 from the start (never briefly
    world-readable under a loose umask), then renamed over `path`."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except OSError as exc:
        raise ConfigError(f"cannot write {path}: {exc.strerror}") from None
    try:
        with os.fdopen(fd, "w") as f:
            os.fchmod(f.fileno(), 0o600)
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise ConfigError(f"cannot write {path}: {exc.strerror}") from None


def read_secret(path: Path, what: str) -> bytes:
    check_private(path, what)
    try:
        data = path.read_bytes().strip()
    except OSError as exc:
        raise ConfigError(f"cannot read {what} {path}: {exc.strerror}") from None
    if len(data) < 16:
        raise ConfigError(f"{what} {path} is too short (need >= 16 bytes)")
    return data
