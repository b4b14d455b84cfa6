"""waiting: the rung is decided; it is issued once admitted (controller/loop/admit/): a
GPU reset or fabric restart ordered from the node's agent (-> resetting), or, with a free
reboot slot, `scontrol reboot ASAP` with the validation's reservation made first (->
rebooting). Held, or no slot: stays waiting, asked again next tick."""

from __future__ import annotations

from datetime import datetime

from babysitter.controller.db.actions import ActionKind
from babysitter.controller.loop.admit.admission import Act
from babysitter.controller.loop.admit.gate import Held
from babysitter.controller.loop.admit.order_permission import issue
from babysitter.controller.loop.decide.ladder import Rung
from babysitter.controller.loop.heal.episode.base import HealerBase, Tick, log
from babysitter.controller.loop.heal.episode.fail import fail
from babysitter.controller.loop.heal.validation import reservation_name
from babysitter.controller.loop.read.ledger import Phase, Remediation
from babysitter.slurm.client import SlurmError, SlurmUnavailable


def waiting(h: HealerBase, rem: Remediation, tick: Tick) -> None:
    """waiting -> resetting (an order), rebooting or failed (the reboot refused by Slurm)."""
    if rem.rung is Rung.RESTART_FABRIC:
        h.fabric_rung.order(rem, tick.now, h.admission)
    elif rem.rung is Rung.RESET_GPU:
        _order_reset(h, rem, tick.now)
    elif rem.rung is Rung.REBOOT and reboot_slots(h, rem.node):
        _issue_reboot(h, rem, tick)


def _order_reset(h: HealerBase, rem: Remediation, now: datetime) -> None:
    """Order the reset from the node's agent: the order is this open ledger row, handed
    to the agent in the answer to its next report (controller/api/orders.py), until it answers.
    The node stays drained meanwhile (the policy drained it; hold() keeps it so)."""
    target = rem.gpu_uuid or rem.evidence.get("bus_id")
    what = f"GPU reset of {target} ordered from the node's agent"
    ttl = h.cfg.reset_timeout_s  # bound to an expiry (order_permission.py)
    if issue(h.admission, h.ledger, rem, Act.RESET_GPU, now, ttl, what):
        return  # held (controller/loop/admit/admission.py): asked again next tick
    h.record(
        ActionKind.RESET_GPU,
        rem.node,
        f"reset_gpu: {rem.fault}",
        f"ordered from the agent ({target})",
        rem.id,
    )
    log.info("%s: GPU reset of %s ordered (%s)", rem.node, target, rem.fault)


def _issue_reboot(h: HealerBase, rem: Remediation, tick: Tick) -> None:
    now = tick.now
    sn = h.snapshot.nodes.get(rem.node)
    row = h.store.node(rem.node) or {}
    boot_id = (row.get("metrics") or {}).get("boot_id")
    reason = f"reboot: {rem.fault}"
    minutes = int(h.cfg.reboot_timeout_s // 60) + h.validation_minutes
    try:
        # admitted, then the reservation first: the node never comes back open to jobs
        hold = (reservation_name(rem.node), h.validation_user, minutes)
        h.admitted.reboot(rem.node, reason, h.cfg.nextstate, hold, now)
    except (Held, SlurmUnavailable):
        return  # held (controller/loop/admit/admission.py) or Slurm away: asked next tick
    except SlurmError as exc:
        fail(h, rem, now, f"scontrol reboot failed: {exc}", tick.firing)
        return
    h.snapshot.stale = True
    h.ledger.move(
        rem,
        Phase.REBOOTING,
        now,
        f"scontrol reboot ASAP nextstate={h.cfg.nextstate} issued",
        issued_at=now.isoformat(),
        boot_time_before=sn.boot_time if sn else "",
        boot_id_before=boot_id,
    )
    h.record(ActionKind.REBOOT, rem.node, reason, "scontrol reboot ASAP issued", rem.id)
    log.info("%s: reboot issued (%s)", rem.node, rem.fault)


def reboot_slots(h: HealerBase, node: str) -> bool:
    """Room for one more node in reboot in each of the node's partitions:
    max(K, P x partition size) nodes at once."""
    rebooting = [r.node for r in h.open.values() if r.state is Phase.REBOOTING]
    sn = h.snapshot.nodes.get(node)
    for p in (sn.partitions if sn else ()) or ("default",):
        size = h.snapshot.partitions.get(p, 1)
        limit = max(h.cfg.max_concurrent_reboots, int(h.cfg.max_concurrent_fraction * size))
        busy = sum(
            1
            for n in rebooting
            if p in ((s.partitions if (s := h.snapshot.nodes.get(n)) else ()) or ("default",))
        )
        if busy >= limit:
            return False
    return True
