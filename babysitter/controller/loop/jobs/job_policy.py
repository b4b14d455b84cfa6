"""The pure job policy: what a babysat job asked for (its babysit spec and its requeue limit)
and what one fault does to it: requeue, hold (limit reached) or skip (this restart generation
was handled already). Facts in, a decision out; JobTracker (jobs.py) gathers the facts."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import cast

from babysitter.controller.db.store import HistoryEntry
from babysitter.job import BabysitSpec, parse_babysit_args
from babysitter.slurm.client import SlurmJob

DEFAULT_MAX_REQUEUES = 3


@dataclass(frozen=True)
class JobDecision:
    kind: str  # requeue | hold | skip
    why: str = ""


def max_requeues(spec: Mapping[str, object]) -> int:
    """The job's limit, from user-controlled text: ASCII digits only, bounded."""
    raw = spec.get("max_requeues", DEFAULT_MAX_REQUEUES)
    if isinstance(raw, bool) or not isinstance(raw, int | str):
        raise ValueError(f"max_requeues {raw!r} is not a number")
    text = str(raw)
    if not (text.isascii() and text.isdigit()) or len(text) > 8:
        raise ValueError(f"max_requeues {text[:20]!r} is not a small ASCII number")
    return int(text)


def decide_requeue(
    restart_count: int, requeues_done: int, history: list[HistoryEntry], limit: int
) -> JobDecision:
    """Requeue, hold (limit reached) or skip (this restart generation was handled already)."""
    for h in history:
        if h.get("restart_count") == restart_count and h.get("event") in ("requeue", "held"):
            return JobDecision(
                "skip", f"restart {restart_count} already handled ({h.get('event')})"
            )
    if requeues_done >= limit:
        return JobDecision("hold", f"max_requeues={limit} reached")
    return JobDecision("requeue")


def babysit_spec(j: SlurmJob) -> BabysitSpec | None:
    """The job's babysit arguments (AdminComment from the plugin, else the Comment fallback);
    None when it did not opt in. Raises on an invalid spec, so the job's error can be shown
    instead of the job being dropped silently."""
    for text in (j.admin_comment, j.comment):
        for token in (text or "").split():
            if token == "babysit" or token.startswith("babysit="):
                # a copy: the caller owns what it gets (it is stored in the job's row)
                return cast(BabysitSpec, dict(_parsed(token)))
    return None


@functools.lru_cache(maxsize=4096)
def _parsed(token: str) -> BabysitSpec:
    """parse_babysit_args, once per distinct spec: every job scan parses every babysat job's
    spec again, and a fleet's jobs carry few distinct ones. A spec it refuses raises each
    time (lru_cache keeps no exception)."""
    return parse_babysit_args(token)
