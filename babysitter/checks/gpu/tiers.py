"""How often each signal of each GPU check is read: data, not code (the rules and the site's
overrides: babysitter/checks/tiers.py). The order is the order of the reads: a signal may use
what an earlier one read in the same run."""

from __future__ import annotations

from collections.abc import Mapping

from babysitter.checks.tiers import FAST, Interval

SIGNALS: Mapping[str, Mapping[str, Interval]] = {
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
        "replays": 60.0,  # one field read per GPU; a rate, so a minute between reads
    },
    "gpu.thermal": {
        "thermal": 30.0,  # temperature, thresholds, clock-event reasons, utilisation
    },
    "gpu.recovery": {
        "action": FAST,  # the driver's recovery action: one batched field read per GPU
    },
}
