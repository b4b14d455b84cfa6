"""The blast-radius guard's state as the remediation loop writes it (kv keys) and as it is
shown: `guard_view` (GET /api/v1/guard, the status page, `babysitter status`)."""

from __future__ import annotations

from typing import Any

from babysitter.controller.db.store import Store
from babysitter.controller.loop.decide.node.rules import rule_description

GUARD_KEY = "guard_tripped"
GUARD_INFO_KEY = "guard"
BLAST_KEY = (
    "blast_radius"  # scoped caps and switch incidents (controller/loop/fabric/fabric_loop.py)
)
NVLINK_DOMAIN_KEY = "nvlink_domain_incidents"  # controller/loop/fabric/nvlink_domain.py


def guard_view(store: Store) -> dict[str, Any]:
    info = dict(store.kv_get(GUARD_INFO_KEY) or {})
    tripped = bool(store.kv_get(GUARD_KEY, False))
    if not info:  # the loop has not run yet (or runs elsewhere and has not written)
        info = {"reason": "", "rule": "", "since": None, "blocked": [], "slurm_data": None}
    # the breaker flag is the truth (an admin reset clears it before the loop rewrites info)
    info["tripped"] = tripped
    if not tripped:
        info.update(rule="", reason="", since=None, blocked=[])
    info["state"] = "tripped" if tripped else ("undecided" if info.get("undecided") else "armed")
    info["rule_description"] = rule_description(info.get("rule"))
    blast = store.kv_get(BLAST_KEY) or {}
    info["blast_radius"] = {
        "caps": blast.get("caps", {}),
        "tripped": blast.get("tripped", []),
    }
    info["switch_incidents"] = blast.get("switch_incidents", [])
    domains = store.kv_get(NVLINK_DOMAIN_KEY)
    info["nvlink_domain_incidents"] = domains if isinstance(domains, list) else []
    info["topology"] = blast.get("topology")
    return info
