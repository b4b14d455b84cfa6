"""One RMA evidence archive from a node's upload (agent/rma.py): the node's part as it sent it,
plus what the controller knows (the node's ledger history, its findings and actions) and a
manifest, written as one tar.gz under `[rma] archive_dir` and recorded on its rma_archives row.
Called by the API's upload route (controller/api/api_rma.py), never by the loop."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import tarfile
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from babysitter.config import Config
from babysitter.controller.db import audit
from babysitter.controller.db.store import Store
from babysitter.controller.loop.heal.rma import (
    COLLECTED,
    FAILED,
    ORDERED,
    Archive,
    archive,
    set_archive,
)
from babysitter.controller.loop.read.ledger import Ledger

HISTORY = 500  # ledger rows, findings and actions of the node, newest first


class Refused(ValueError):
    """Not an upload this controller asked this node for (404), or one already taken (409)."""

    def __init__(self, status: int, why: str) -> None:
        super().__init__(why)
        self.status = status


def _json(data: Any) -> bytes:
    return json.dumps(data, indent=2, default=str).encode()


# what reading the agent's part may decompress beyond its own size: its bug report is already
# compressed (stored as is) and its kernel log is a bounded number of lines, so a real part
# expands little; a gzip bomb stops here instead of costing the controller seconds of CPU
MANIFEST_SCAN_SLACK = 64 * 1024 * 1024


class _Capped:
    """A read()-only stream that raises once more than `cap` bytes came through it."""

    def __init__(self, raw: Any, cap: int) -> None:
        self.raw, self.left = raw, cap

    def read(self, n: int = -1) -> bytes:
        data: bytes = self.raw.read(n if n >= 0 else self.left + 1)
        self.left -= len(data)
        if self.left < 0:
            raise OSError("the node's part decompresses past its bound")
        return data


def _node_manifest(part: bytes, slack: int = MANIFEST_SCAN_SLACK) -> dict[str, Any]:
    """What the agent said it collected (its node-manifest.json); {} when unreadable or when
    finding it would decompress more than the part's size + `slack`."""
    stream = _Capped(gzip.GzipFile(fileobj=io.BytesIO(part)), len(part) + slack)
    try:
        # "r|" reads the stream once, front to back: read() is all it needs (the stubs want more)
        with tarfile.open(fileobj=stream, mode="r|") as tar:  # type: ignore[call-overload]
            for member in tar:
                if member.name == "node-manifest.json":
                    f = tar.extractfile(member)
                    doc = json.loads(f.read(64 * 1024)) if f else {}
                    return doc if isinstance(doc, dict) else {}
    except (tarfile.TarError, KeyError, ValueError, OSError, EOFError):
        return {}
    return {}


def _members(store: Store, a: Archive, part: bytes, now: datetime) -> dict[str, bytes]:
    node = _node_manifest(part)
    manifest = {
        "node": a.node,
        "trigger": a.trigger,
        "ordered_at": a.created_at.isoformat(),
        "received_at": now.isoformat(),
        "node_part_sha256": hashlib.sha256(part).hexdigest(),
        "bug_report": node.get("bug_report", "unknown: the node's manifest is unreadable"),
        "kernel_log": node.get("kernel_log", "unknown: the node's manifest is unreadable"),
    }
    ledger = [r.to_json() for r in Ledger(store).history(a.node, HISTORY)]
    findings = store.findings(node=a.node, limit=HISTORY)
    row = store.node(a.node) or {}
    open_findings = [f.to_json_dict() for f in row.get("open_findings", [])]
    actions = [x.to_json() for x in store.actions(limit=5000) if x.node == a.node][:HISTORY]
    return {
        "manifest.json": _json(manifest),
        "node-evidence.tar.gz": part,
        "ledger.json": _json(ledger),
        "findings.json": _json({"open": open_findings, "history": findings}),
        "actions.json": _json(actions),
    }


def _write(out_dir: Path, name: str, members: dict[str, bytes]) -> tuple[int, str]:
    """The archive, written whole or not at all (a temporary file renamed); (size, sha256)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=out_dir, prefix=".upload-")
    try:
        with os.fdopen(fd, "wb") as f, tarfile.open(fileobj=f, mode="w:gz") as tar:
            for member, data in members.items():
                info = tarfile.TarInfo(f"{name.removesuffix('.tar.gz')}/{member}")
                info.size, info.mtime = len(data), int(time.time())
                tar.addfile(info, io.BytesIO(data))
        os.replace(tmp, out_dir / name)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    data = (out_dir / name).read_bytes()
    return len(data), hashlib.sha256(data).hexdigest()


def receive(
    store: Store, cfg: Config, node: str, order: str, part: bytes, now: datetime
) -> Archive:
    """Store NODE's upload for ORDER as the archive; the row and its action say so."""
    a = archive(store, order=order)
    if a is None or a.node != node:
        raise Refused(404, f"no RMA evidence order {order} for {node}")
    if a.state != ORDERED:
        raise Refused(409, f"RMA evidence order {order} is {a.state} already")
    name = f"rma-{node}-{a.id}-{now.strftime('%Y%m%dT%H%M%SZ')}.tar.gz"
    members = _members(store, a, part, now)
    try:
        size, digest = _write(Path(cfg.rma.archive_dir), name, members)
    except OSError as exc:  # a full or unwritable archive_dir: a failed collection, alerted
        why = f"cannot store the archive in {cfg.rma.archive_dir}: {exc.strerror or exc}"
        set_archive(store, a.id, state=FAILED, outcome=why, updated_at=now)
        if a.action_id:
            store.update_action(a.action_id, status="failed", done_at=now, outcome=why)
            audit.record_actions(store, [a.action_id], now)
        raise Refused(507, why) from None
    manifest = json.loads(members["manifest.json"])
    outcome = f"bug report {manifest['bug_report']}; kernel log {manifest['kernel_log']}"[:1000]
    set_archive(
        store,
        a.id,
        state=COLLECTED,
        path=name,
        size=size,
        sha256=digest,
        outcome=outcome,
        updated_at=now,
    )
    if a.action_id:
        store.update_action(
            a.action_id, status="done", done_at=now, outcome=f"archive {name}: {outcome}"[:1000]
        )
        audit.record_actions(store, [a.action_id], now)
    got = archive(store, a.id)
    assert got is not None
    return got


def path_of(cfg: Config, a: Archive) -> Path | None:
    """The archive's file (None: not collected, or gone from the disk)."""
    if a.state != COLLECTED or not a.path or "/" in a.path:
        return None
    p = Path(cfg.rma.archive_dir) / a.path
    return p if p.is_file() else None
