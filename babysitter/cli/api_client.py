"""The CLI's HTTP client of the controller API: base URL and token from the config (or
--url/--token), errors as BabysitterError with the controller's own message."""

from __future__ import annotations

import getpass
import os
import socket
from typing import Any

import click
import httpx

from babysitter.cli.common import State
from babysitter.errors import BabysitterError

url_opt = click.option("--url", envvar="BABYSITTER_URL", help="Controller URL.")
token_opt = click.option("--token", envvar="BABYSITTER_TOKEN", help="Admin or read token.")


def _who() -> str:
    """user@host of whoever runs the CLI: the audit log says who asked, not only 'admin'."""
    try:
        user = getpass.getuser()
    except (OSError, KeyError):
        user = str(os.getuid())
    return f"{user}@{socket.gethostname().split('.')[0]}"[:64]


def client(state: State, url: str | None, token: str | None) -> httpx.Client:
    cfg = state.config
    if not token:
        try:
            token = cfg.controller.admin_token_file.read_text().strip()
        except OSError:
            token = os.environ.get("BABYSITTER_TOKEN", "")
    from babysitter.agent.shipper import tls_verify

    return httpx.Client(
        base_url=(url or cfg.agent.controller_url).rstrip("/"),
        timeout=10,
        headers={"Authorization": f"Bearer {token}", "X-Babysitter-Actor": _who()},
        verify=tls_verify(cfg.agent.ca_file),
    )


def call(c: httpx.Client, method: str, path: str, **kw: Any) -> Any:
    try:
        r = c.request(method, path, **kw)
    except httpx.HTTPError as exc:
        raise BabysitterError(f"controller at {c.base_url} unreachable: {exc}") from None
    if r.status_code >= 400:
        try:
            detail = _detail(r.json().get("detail"))
        except (ValueError, AttributeError):
            detail = r.text[:200]
        raise BabysitterError(f"{method} {path}: HTTP {r.status_code}: {detail}")
    return r.json()


def _detail(detail: Any) -> str:
    """An error's detail as one line: a validation error (a list of {loc, msg}) as
    `field: message`, anything else as it came."""
    if isinstance(detail, list) and all(isinstance(d, dict) for d in detail):
        return "; ".join(
            f"{'.'.join(str(x) for x in d.get('loc', [])[1:]) or 'request'}: "
            f"{str(d.get('msg', '')).removeprefix('Value error, ')}"
            for d in detail
        )
    return str(detail)
