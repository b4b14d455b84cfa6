"""The version of the agent <-> controller wire formats (the report, POST /api/v1/reports, and
the orders in the controller's answer), and the skew policy (docs/deploy.md, "Supported version
skew and upgrade order"):

- The controller accepts reports from agents of its own wire version and the one before (N-1);
  the agent takes the answers and orders of a controller of its own version and the one before.
- A peer's unknown fields are ignored, never refused: a newer agent may send a field this
  controller does not know, a newer controller may add one to an order.
- The version rides in a header both ways (`X-Babysitter-Wire`), not in the report body: the
  controllers of wire 1 (babysitter 0.1) refuse a report with an unknown top-level key, so a
  wire-2 agent must send them the body they know. The report model still takes a
  `wire_version` body field (default 1: an old agent's report) for agents from wire 3 on, whose
  oldest supported controller ignores unknown keys.

An order in the answer (`{"check", "id", ...}`) also names, since issue 49, its `node`,
its `episode` (the controller's ledger row) and `expires_at` (ISO 8601): optional fields, so
the wire version stays 2. An agent that knows them refuses an order for another node or one
past its expiry, and remembers the orders it took across restarts (agent/order_gate.py); an
older agent ignores them and carries the order out as before, remembering it in memory only.
Either way the controller hands an order only to its own node, never past its expiry, never
in a maintenance window or under someone else's Slurm reason (controller/api/orders.py).

Kept free of imports: the agent and the one-shot check import it on every node.
"""

from __future__ import annotations

WIRE_VERSION = 2  # babysitter 0.2: unknown fields ignored both ways, the version in a header
OLDEST_SUPPORTED = WIRE_VERSION - 1  # N-1, both directions
HEADER = "X-Babysitter-Wire"
HEADER_BYTES = HEADER.lower().encode()  # as ASGI hands headers over


def peer_version(value: str | bytes | None) -> int:
    """A peer's wire version from its header; no header (or a bad one): 1, the version before
    the header existed."""
    if value is None:
        return 1
    try:
        v = int(value)
    except ValueError:
        return 1
    return v if v >= 1 else 1


def supported(version: int) -> bool:
    """Within the supported skew (N-1 .. N). A newer peer is served too (its unknown fields
    are ignored), but only N-1 .. N is tested."""
    return version >= OLDEST_SUPPORTED
