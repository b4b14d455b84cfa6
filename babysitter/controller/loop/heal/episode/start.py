"""The start of an episode, and of each next rung after a failed one: a node drained for a
reset- or reboot-class fault gets a ledger row in one of the entry phases of the state
machine (states.py ENTRY): `waiting` for its rung, `inspect` (held for a human), `lemon` (too
many remediations) or `dry_run` (what would have happened)."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from babysitter.controller.db.actions import ActionKind
from babysitter.controller.loop.decide.ladder import Rung, remediable
from babysitter.controller.loop.heal.episode.base import HealerBase, log
from babysitter.controller.loop.heal.episode.fault import Fault
from babysitter.controller.loop.heal.episode.lemon_episode import lemon_by_count
from babysitter.controller.loop.read.ledger import Phase
from babysitter.controller.loop.record.alerts import Alert
from babysitter.finding import Finding, Severity


def start(
    h: HealerBase, node: str, findings: list[Finding], now: datetime, firing: list[Alert]
) -> None:
    """The node's first rung, for the fault whose ladder starts strongest."""
    faults = [f for f in findings if remediable(f)]
    if not faults:
        return
    # a reboot covers a reset-class fault too: the fault with the strongest first rung
    fault = max(
        (Fault.of(f) for f in faults),
        key=lambda x: h.ladder.first(x.klass, x.action) is Rung.REBOOT,
    )
    climb(h, node, fault, h.ladder.first(fault.klass, fault.action), now, firing)


def climb(
    h: HealerBase, node: str, fault: Fault, rung: Rung, now: datetime, firing: list[Alert]
) -> None:
    """Put the node on `rung`, after the limits: lemon first, then whether the rung can
    run here at all."""
    common = fault.common()
    if rung.automatic:
        window = timedelta(days=h.cfg.lemon_window_days)
        gpus = {g for g in (fault.gpu_uuid, fault.gpu_serial) if g}
        past = h.ledger.counted(node, gpus, now - window)
        if len(past) >= h.cfg.lemon_remediations:
            lemon_by_count(h, node, fault, past, now, common)
            return
        rung = _runnable(h, rung, fault, common["evidence"])
    if h.dry_run:
        _dry_run(h, node, fault, rung, now, common)
    elif not rung.automatic:
        hold_for_human(h, node, fault, rung, now, firing, common)
    else:
        _wait(h, node, fault, rung, now, common)


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


def _dry_run(
    h: HealerBase, node: str, fault: Fault, rung: Rung, now: datetime, common: dict[str, Any]
) -> None:
    """-> dry_run: what would have happened, nothing done."""
    h.ledger.add(
        node,
        rung,
        fault.klass,
        fault.summary,
        Phase.DRY_RUN,
        now,
        outcome=f"dry-run: would {rung.value}",
        **common,
    )


def _wait(
    h: HealerBase, node: str, fault: Fault, rung: Rung, now: datetime, common: dict[str, Any]
) -> None:
    """-> waiting: the rung is decided; issued this tick or when a reboot slot frees."""
    rem = h.ledger.add(
        node,
        rung,
        fault.klass,
        fault.summary,
        Phase.WAITING,
        now,
        outcome=f"{rung.value} decided",
        **common,
    )
    h.open[node] = rem
    log.info("%s: %s decided for %s (ledger row %s)", node, rung.value, fault.klass, rem.id)


def hold_for_human(
    h: HealerBase,
    node: str,
    fault: Fault,
    rung: Rung,
    now: datetime,
    firing: list[Alert],
    common: dict[str, Any],
) -> None:
    """-> inspect: a rung no automation runs (inspect, rma, or one this cluster cannot run):
    the node stays drained for an admin, in the ledger and, for the ladder's own choice, paged."""
    skipped = common["evidence"].get("skipped")
    why = skipped or f"the {fault.klass} ladder says {rung.value}"
    # a rung this cluster cannot run leaves the node as babysitter without
    # self-healing would (drained, paged by its node_unhealthy alert; a human's
    # reboot that clears the fault returns it); an inspect/rma the ladder chose, or
    # one after a failed rung, holds it for an admin and pages on its own
    common["evidence"]["hold"] = not skipped
    rem = h.ledger.add(
        node,
        rung,
        fault.klass,
        fault.summary,
        Phase.INSPECT,
        now,
        outcome=f"stays drained for a human: {why}",
        **common,
    )
    h.record(ActionKind.INSPECT, node, f"{rung.value}: {fault.summary}", why, rem.id)
    # the node's episode now (this tick must not start another one on it)
    h.open[node] = rem
    if skipped:
        log.warning("%s: no automatic %s: %s", node, fault.klass, why)
        return
    firing.append(
        Alert(
            node,
            "remediation_inspect",
            Severity.CRITICAL,
            f"{node} needs {'an RMA' if rung is Rung.RMA else 'hardware inspection'}: "
            f"{fault.summary}",
            f"stays drained, no automatic remediation: {why}",
            now,
            details={"fault_class": fault.klass, "rung": rung.value},
        )
    )
