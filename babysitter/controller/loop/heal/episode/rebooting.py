"""rebooting: `scontrol reboot ASAP` was issued (waiting.py). Slurm lets the jobs end, runs
the RebootProgram, sees the boot. Back = Slurm shows a new boot time without a reboot flag
AND the agent reports a new boot id: a fault still reported fails the rung at once, else the
validation job runs (validating.py). Not back within reboot_timeout_s: timed_out, paged."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from babysitter.controller.db.actions import ActionKind, ActionStatus
from babysitter.controller.loop.decide.ladder import remediable
from babysitter.controller.loop.heal.episode.base import REBOOT_FLAGS, HealerBase, Tick
from babysitter.controller.loop.heal.episode.fail import fail
from babysitter.controller.loop.heal.episode.validating import validate
from babysitter.controller.loop.heal.takeover import cancel_pending_reboot
from babysitter.controller.loop.read.ledger import Phase, Remediation
from babysitter.controller.loop.record.alerts import Alert
from babysitter.finding import Severity
from babysitter.slurm.client import SlurmNode


def rebooting(h: HealerBase, rem: Remediation, tick: Tick) -> None:
    """rebooting -> rebooting (started, noted once), validating or failed (back), timed_out."""
    sn = h.snapshot.nodes.get(rem.node)
    ev = rem.evidence
    issued = datetime.fromisoformat(ev["issued_at"])
    _note_started(h, rem, sn, tick.now)
    booted = (
        sn is not None
        and bool(sn.boot_time)
        and sn.boot_time != ev.get("boot_time_before")
        and not sn.flags & REBOOT_FLAGS
    )
    row = h.store.node(rem.node) or {}
    agent_boot = (row.get("metrics") or {}).get("boot_id")
    if booted and agent_boot and agent_boot != ev.get("boot_id_before"):
        _back(h, rem, tick, row, agent_boot)
        return
    if (tick.now - issued).total_seconds() > h.cfg.reboot_timeout_s:
        _timed_out(h, rem, tick)


def _note_started(h: HealerBase, rem: Remediation, sn: SlurmNode | None, now: datetime) -> None:
    if (
        sn is not None
        and sn.flags & REBOOT_FLAGS
        and "reboot_started_at" not in rem.evidence
        and ("REBOOT_ISSUED" in sn.flags or sn.down)
    ):
        # Slurm waited for the jobs to end and handed the node to its RebootProgram
        h.ledger.move(rem, rem.state, now, "rebooting", reboot_started_at=now.isoformat())


def _back(h: HealerBase, rem: Remediation, tick: Tick, row: dict[str, Any], boot: str) -> None:
    """Booted (Slurm and the agent agree): the fault gone -> validation, else the next rung."""
    now = tick.now
    persisting = [f for f in row["open_findings"] if remediable(f)]
    # (once: a held validation is asked again on later ticks)
    at = rem.evidence.get("booted_at", now.isoformat())
    h.ledger.move(rem, rem.state, now, "back", booted_at=at, boot_id=boot)
    if persisting:
        why = f"fault still there after the reboot: {persisting[0].message}"
        fail(h, rem, now, why, tick.firing)
        return
    validate(h, rem, now, f"after reboot: {rem.fault}", tick.firing)


def _timed_out(h: HealerBase, rem: Remediation, tick: Tick) -> None:
    """-> timed_out: not back in time; paged, stays drained for a human."""
    now = tick.now
    why = f"not back {h.cfg.reboot_timeout_s:g} s after its reboot"
    # a reboot still pending (jobs never ended) must not happen later, unwatched
    cancelled = cancel_pending_reboot(h.slurm, rem)
    h.ledger.move(rem, Phase.TIMED_OUT, now, "; ".join(filter(None, (why, cancelled))))
    h.record(
        ActionKind.REBOOT,
        rem.node,
        why,
        "; ".join(filter(None, ("paged; stays drained", cancelled))),
        rem.id,
        status=ActionStatus.FAILED,
    )
    tick.firing.append(
        Alert(
            rem.node,
            "remediation_timeout",
            Severity.CRITICAL,
            f"{rem.node}: {why} ({rem.fault})",
            "stays out of service for a human",
            now,
        )
    )
