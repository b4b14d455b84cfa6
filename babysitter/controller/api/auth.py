"""Tokens: a node's token is HMAC-SHA256(cluster secret, node name), so there is no token table
to manage and a token is valid only for its own node. Admin and read tokens come from files.

A report is authenticated from its headers alone, before its body is read: the agent names its
node in `X-Babysitter-Node` (NODE_HEADER). A token sent without that header is recognised only
if it belongs to a node the controller already knows (agents from before the header)."""

from __future__ import annotations

import functools
import hashlib
import hmac
import secrets
from collections.abc import Iterable
from dataclasses import dataclass


def node_token(secret: bytes, node: str) -> str:
    return hmac.new(secret, f"node:{node}".encode(), hashlib.sha256).hexdigest()


# Every report needs its node's token; 10k nodes x 5 s would recompute each one per report.
_node_token_cached = functools.lru_cache(maxsize=65536)(node_token)


NODE_HEADER = "x-babysitter-node"


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
