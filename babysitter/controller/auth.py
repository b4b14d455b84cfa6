"""Tokens: a node's token is HMAC-SHA256(cluster secret, node name), so there is no token table
to manage and a token is valid only for its own node. Admin and read tokens come from files.

A report is authenticated from its headers alone, before its body is read: the agent names its
node in `X-Babysitter-Node` (NODE_HEADER). A token sent without that header is recognised only
if it belongs to a node the controller already knows (agents from before the header)."""

from __future__ import annotations

import functools
import hashlib
import hmac
import os
import secrets
import stat
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from babysitter.errors import ConfigError


def node_token(secret: bytes, node: str) -> str:
    return hmac.new(secret, f"node:{node}".encode(), hashlib.sha256).hexdigest()


# Every report needs its node's token; 10k nodes x 5 s would recompute each one per report.
_node_token_cached = functools.lru_cache(maxsize=65536)(node_token)


NODE_HEADER = "x-babysitter-node"


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


@dataclass
class Principal:
    role: str  # node | admin | read
    node: str | None = None


class Authenticator:
    def __init__(self, secret: bytes, admin_token: str, read_token: str | None = None) -> None:
        self.secret = secret
        self.admin_token = admin_token
        self.read_token = read_token
        # token -> node, for senders without NODE_HEADER (bounded by the nodes that exist)
        self._known: dict[bytes, str] = {}

    def learn(self, nodes: Iterable[str]) -> None:
        """Nodes whose token is recognised even without NODE_HEADER."""
        for n in nodes:
            self._known[_node_token_cached(self.secret, n).encode()] = n

    def sender(self, token: str, node: str | None) -> Principal | None:
        """Who sends a report, from the request's headers only (the body is not read yet)."""
        p = self.identify(token, claimed_node=node)
        if p is None and node is None:
            known = self._known.get(token.encode("utf-8", "surrogateescape"))
            if known is not None:
                return Principal("node", known)
        return p

    def identify(self, token: str, claimed_node: str | None = None) -> Principal | None:
        # compared as bytes: compare_digest refuses non-ASCII str, and a header may carry any
        # byte (latin-1 decoded); a garbage token must be a 403, not a crash
        given = token.encode("utf-8", "surrogateescape")
        if secrets.compare_digest(given, self.admin_token.encode()):
            return Principal("admin")
        if self.read_token and secrets.compare_digest(given, self.read_token.encode()):
            return Principal("read")
        if claimed_node is not None and secrets.compare_digest(
            given, _node_token_cached(self.secret, claimed_node).encode()
        ):
            return Principal("node", claimed_node)
        return None
