"""The start of an episode, and of each next rung after a failed one: a node drained for a
reset- or reboot-class fault gets a ledger row in one of the entry phases of the state
machine (states.py ENTRY): `waiting` for its rung, `inspect` (held for a human), `lemon` (too
many remediations) or `dry_run` (what would have happened)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from babysitter.controller.db.actions import ActionKind
from babysitter.controller.loop.decide.ladder import Rung, remediable
from babysitter.controller.loop.heal.episode.base import HealerBase, log
from babysitter.controller.loop.heal.episode.fault import Fault
from babysitter.controller.loop.heal.episode.lemon_episode import lemon_by_count
from babysitter.controller.loop.read.ledger import NewRow, Phase, Remediation
from babysitter.controller.loop.record.alerts import Alert
from babysitter.finding import Finding, Severity


def start(
    h: HealerBase,
    node: str,
    findings: list[Finding],
    now: datetime,
    firing: list[Alert],
    batch: list[Opening],
) -> None:
    """The node's first rung, for the fault whose ladder starts strongest (added to `batch`,
    written by `open_all`)."""
    faults = [f for f in findings if remediable(f)]
    if not faults:
        return
    # a reboot covers a reset-class fault too: the fault with the strongest first rung
    fault = max(
        (Fault.of(f) for f in faults),
        key=lambda x: h.ladder.first(x.klass, x.action) is Rung.REBOOT,
    )
    plan(h, node, fault, h.ladder.first(fault.klass, fault.action), now, firing, batch)


def climb(
    h: HealerBase, node: str, fault: Fault, rung: Rung, now: datetime, firing: list[Alert]
) -> None:
    """Put the node on `rung` now (the next rung after a failed one)."""
    batch: list[Opening] = []
    plan(h, node, fault, rung, now, firing, batch)
    open_all(h, batch, now, firing)


@dataclass
class Opening:
    """A start decided, not written yet: its ledger row, and for a hold its record and page."""

    row: NewRow
    fault: Fault
    why: str = ""  # a hold's: why no automation runs it
    page: bool = False  # a hold the ladder chose pages on its own


def plan(
    h: HealerBase,
    node: str,
    fault: Fault,
    rung: Rung,
    now: datetime,
    firing: list[Alert],
    batch: list[Opening],
) -> None:
    """Decide the node's start on `rung`, after the limits: lemon first, then whether the
    rung can run here at all. A lemon is made at once (it drains through Slurm), after the
    starts decided before it are written, so rows keep the order of their nodes."""
    common = fault.common()
    if rung.automatic:
        window = timedelta(days=h.cfg.lemon_window_days)
        gpus = {g for g in (fault.gpu_uuid, fault.gpu_serial) if g}
        past = h.ledger.counted(node, gpus, now - window)
        if len(past) >= h.cfg.lemon_remediations:
            open_all(h, batch, now, firing)
            batch.clear()
            lemon_by_count(h, node, fault, past, now, common)
            return
        rung = _runnable(h, rung, fault, common["evidence"])
    if h.dry_run:  # -> dry_run: what would have happened, nothing done
        phase, outcome = Phase.DRY_RUN, f"dry-run: would {rung.value}"
        batch.append(Opening(_row(node, rung, fault, phase, outcome, common), fault))
    elif not rung.automatic:
        batch.append(_hold(node, fault, rung, common))
    else:  # -> waiting: the rung is decided; issued this tick or when a reboot slot frees
        phase, outcome = Phase.WAITING, f"{rung.value} decided"
        batch.append(Opening(_row(node, rung, fault, phase, outcome, common), fault))


def _row(
    node: str, rung: Rung, fault: Fault, phase: Phase, outcome: str, common: dict[str, Any]
) -> NewRow:
    return NewRow(node, rung, fault.klass, fault.summary, phase, outcome=outcome, **common)


def _hold(node: str, fault: Fault, rung: Rung, common: dict[str, Any]) -> Opening:
    """-> inspect: a rung no automation runs (inspect, rma, or one this cluster cannot run):
    the node stays drained for an admin, in the ledger and, for the ladder's own choice, paged.
    A rung this cluster cannot run leaves the node as babysitter without self-healing would
    (drained, paged by its node_unhealthy alert; a human's reboot that clears the fault
    returns it); an inspect/rma the ladder chose, or one after a failed rung, holds it for an
    admin and pages on its own."""
    skipped = common["evidence"].get("skipped")
    why = skipped or f"the {fault.klass} ladder says {rung.value}"
    common["evidence"]["hold"] = not skipped
    outcome = f"stays drained for a human: {why}"
    return Opening(_row(node, rung, fault, Phase.INSPECT, outcome, common), fault, why, not skipped)


def open_all(h: HealerBase, batch: list[Opening], now: datetime, firing: list[Alert]) -> None:
    """Write the starts decided: their ledger rows in one statement, the holds' records in
    one; each node's episode is its new row from now on (this tick starts no other)."""
    rems = h.ledger.add_many([o.row for o in batch], now)
    held = []
    for o, rem in zip(batch, rems, strict=True):
        if rem.state is Phase.DRY_RUN:
            continue
        h.open[rem.node] = rem
        if rem.state is Phase.WAITING:
            klass, rung = o.fault.klass, rem.rung.value
            log.info("%s: %s decided for %s (ledger row %s)", rem.node, rung, klass, rem.id)
            continue
        what = f"{rem.rung.value}: {o.fault.summary}"
        held.append((ActionKind.INSPECT, rem.node, what, o.why, rem.id))
        if not o.page:
            log.warning("%s: no automatic %s: %s", rem.node, o.fault.klass, o.why)
            continue
        firing.append(_inspect_alert(rem, o.fault, o.why, now))
    h.record_many(held)


def _inspect_alert(rem: Remediation, fault: Fault, why: str, now: datetime) -> Alert:
    return Alert(
        rem.node,
        "remediation_inspect",
        Severity.CRITICAL,
        f"{rem.node} needs {'an RMA' if rem.rung is Rung.RMA else 'hardware inspection'}: "
        f"{fault.summary}",
        f"stays drained, no automatic remediation: {why}",
        now,
        details={"fault_class": fault.klass, "rung": rem.rung.value},
    )


def _runnable(h: HealerBase, rung: Rung, fault: Fault, evidence: dict[str, Any]) -> Rung:
    """`rung`, or the one that replaces it when it cannot run here (noted in `evidence`)."""
    why_not = cannot(h, rung, fault)
    while why_not and rung is Rung.RESET_GPU:
        # a reset that cannot be ordered here: the next rung (a reboot) instead
        evidence["reset_skipped"] = why_not
        rung = h.ladder.after(fault.klass, fault.action, rung)
        why_not = cannot(h, rung, fault)
    if why_not:
        rung = Rung.INSPECT
        evidence["skipped"] = why_not
    return rung


def cannot(h: HealerBase, rung: Rung, fault: Fault) -> str:
    """Why an automatic rung cannot run on this cluster for this fault ("" when it can)."""
    if rung is Rung.RESET_GPU and not (fault.gpu_uuid or fault.bus_id):
        return "the fault names no GPU (no UUID, no PCI bus id) to reset"
    if rung is Rung.REBOOT and not h.reboot_program():
        return "slurm.conf has no RebootProgram, so `scontrol reboot` cannot complete"
    return ""
