"""The status page's login cookie: `role.expiry.signature`, signed with a key derived from the
cluster secret and the current admin/read tokens (rotating a token ends every session made
with the old ones). The cookie carries no token; it grants only viewing, whatever the role."""

from __future__ import annotations

import hashlib
import hmac
import time

COOKIE = "babysitter_ui"
LIFETIME_S = 12 * 3600
ROLES = ("admin", "read")


class Sessions:
    def __init__(self, secret: bytes, *tokens: str | None) -> None:
        material = b"\0".join(t.encode() for t in tokens if t)
        self._key = hmac.new(secret, b"ui-session\0" + material, hashlib.sha256).digest()

    def _sign(self, payload: str) -> str:
        return hmac.new(self._key, payload.encode(), hashlib.sha256).hexdigest()

    def issue(self, role: str, now: float | None = None) -> str:
        expiry = int((now or time.time()) + LIFETIME_S)
        payload = f"{role}.{expiry}"
        return f"{payload}.{self._sign(payload)}"

    def role(self, cookie: str | None, now: float | None = None) -> str | None:
        """The role a cookie grants, or None (absent, forged, expired, malformed)."""
        if not cookie or len(cookie) > 256:
            return None
        parts = cookie.split(".")
        if len(parts) != 3 or parts[0] not in ROLES or not parts[1].isdigit():
            return None
        role, expiry, sig = parts
        if not hmac.compare_digest(sig.encode(), self._sign(f"{role}.{expiry}").encode()):
            return None
        if int(expiry) < (now or time.time()):
            return None
        return role
