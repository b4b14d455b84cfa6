"""Which signal of which check is read how often: data, not code.

A check reads several signals (gpu.memory: the volatile DBE counter, row remapping, the
lifetime counters, ...). Each signal has an interval here: `FAST` puts it in the fast tier
(`agent.fast_interval_s`, default 1 s), which holds only cheap reads of faults that kill jobs;
a number is the slow-tier interval in seconds that the signal deserves. A site overrides any
entry with `[checks.<section>] signal_intervals = {"<check>/<signal>" = seconds | "fast"}`, and
`[checks.<section>] interval_s` still forces every signal of that section to one interval.

A check with no entry here is one signal at its class `interval_s`.
"""

from __future__ import annotations

from typing import Final

FAST: Final = "fast"

SIGNALS: dict[str, dict[str, float | str]] = {
    "gpu.presence": {
        "handles": FAST,  # device count + one handle lookup per GPU: GPU lost / off the bus
    },
    "gpu.memory": {
        "dbe_volatile": FAST,  # uncorrectable ECC since the last reset: one counter read
        "row_remap": FAST,  # remap pending / failed: one read (Ampere+)
        "retired_pending": 60.0,  # page retirement pending (pre-Ampere)
        "retired_pages": 60.0,  # two-call list read per cause: not cheap
        "dbe_aggregate": 300.0,  # lifetime counters: history, not news
        "sbe_volatile": 60.0,
    },
    "gpu.nvlink": {
        "state": FAST,  # one batched field read per GPU: every link's state
        "per_link_state": 30.0,  # one read per link: drivers without the state field (< r550)
        "errors": 60.0,  # 4 counters per active link: the most calls of any signal
    },
    "gpu.pcie": {
        "width": 30.0,  # a narrower link costs bandwidth, not the job
        "generation": 300.0,  # idle GPUs drop their generation: informational
    },
    "gpu.thermal": {
        "thermal": 30.0,  # temperature, thresholds, clock-event reasons, utilisation
    },
    "ib.ports": {
        "state": FAST,  # state of each port (+ phys_state when down): small sysfs reads
        "counters": 30.0,  # rate and error counters (deltas over time)
    },
}


def table(check: str) -> dict[str, float | str]:
    return dict(SIGNALS.get(check, {}))
