"""Tokens: a node's token is HMAC-SHA256(cluster secret, node name), so there is no token table
to manage and a token is valid only for its own node. Admin and read tokens come from files."""

from __future__ import annotations

import functools
import hashlib
import hmac
import secrets
from dataclasses import dataclass
from pathlib import Path

from babysitter.errors import ConfigError


def node_token(secret: bytes, node: str) -> str:
    return hmac.new(secret, f"node:{node}".encode(), hashlib.sha256).hexdigest()


# Every report needs its node's token; 10k nodes x 5 s would recompute each one per report.
_node_token_cached = functools.lru_cache(maxsize=65536)(node_token)


def read_secret(path: Path, what: str) -> bytes:
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
