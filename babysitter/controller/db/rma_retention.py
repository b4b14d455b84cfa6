"""RMA evidence archives are large (a bug report is up to `[rma] max_mb`) and kept on the
controller's disk: after `[rma] keep_days` an archive's file is deleted and its row says so
(state `expired`), so the node's history still shows that evidence was collected, when and
its sha256, but the disk does not fill with years of bug reports. Run by the retention thread
(controller/db/retention.py), the leader only."""

from __future__ import annotations

import logging
from datetime import datetime
from pathlib import Path

from sqlalchemy import select, update

from babysitter.controller.db import models as m
from babysitter.controller.db import store as store_mod
from babysitter.controller.db.store import Store

log = logging.getLogger(__name__)
COLLECTED, EXPIRED = "collected", "expired"  # the states of controller/loop/heal/rma.py


def expire_archives(store: Store, archive_dir: Path, cutoff: datetime, batch: int = 200) -> int:
    """Delete the files of up to `batch` collected archives created before `cutoff`; returns
    how many expired (one whose file could not be deleted stays collected, tried next round)."""
    t = m.rma_archives
    with store.engine.connect() as c:
        rows = c.execute(
            select(t.c.id, t.c.path, t.c.outcome)
            .where(t.c.state == COLLECTED, t.c.created_at < cutoff)
            .order_by(t.c.id)
            .limit(batch)
        ).all()
    expired = 0
    for aid, path, outcome in rows:
        if path:
            # only a plain name under archive_dir: a row never names a path elsewhere
            target = archive_dir / Path(path).name
            try:
                target.unlink(missing_ok=True)
            except OSError as exc:
                log.warning("RMA archive %s: could not delete %s: %s", aid, target, exc)
                continue  # kept collected: tried again next round
        note = f"archive deleted after [rma] keep_days (created before {cutoff:%Y-%m-%d})"
        with store.engine.begin() as c:
            c.execute(
                update(t)
                .where(t.c.id == aid)
                .values(
                    state=EXPIRED,
                    path=None,
                    outcome="; ".join(filter(None, (outcome, note))),
                    updated_at=store_mod.now(),  # the store's clock (mocked in tests)
                )
            )
        expired += 1
    return expired
