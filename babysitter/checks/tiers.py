"""Which signal of which check is read how often: data, not code.

A check reads several signals (gpu.memory: the volatile DBE counter, row remapping, the
lifetime counters, ...). Each check's folder has its table (checks/gpu/tiers.py, ...), which
the check class carries as `signals`: `FAST` puts a signal in the fast tier
(`agent.fast_interval_s`, default 1 s), which holds only cheap reads of faults that kill jobs;
a number is the slow-tier interval in seconds that the signal deserves. A site overrides any
entry with `[checks.<section>] signal_intervals = {"<check>/<signal>" = seconds | "fast"}`, and
`[checks.<section>] interval_s` still forces every signal of that section to one interval.

A check with no table is one signal at its class `interval_s`.
"""

from __future__ import annotations

from typing import Final, Literal

FAST: Final = "fast"
Interval = float | Literal["fast"]  # seconds, or FAST
