"""How often each signal of the InfiniBand check is read (rules and overrides:
babysitter/checks/tiers.py)."""

from __future__ import annotations

from collections.abc import Mapping

from babysitter.checks.tiers import FAST, Interval

SIGNALS: Mapping[str, Interval] = {
    "state": FAST,  # state of each port (+ phys_state when down): small sysfs reads
    "counters": 30.0,  # rate and error counters (deltas over time)
}
