"""How often each signal of the fabric check is read (rules and overrides:
babysitter/checks/tiers.py)."""

from __future__ import annotations

from collections.abc import Mapping

from babysitter.checks.tiers import Interval

SIGNALS: Mapping[str, Interval] = {
    "state": 10.0,  # one NVML fabric-info call per GPU: training state, status, health mask
    "fabric_manager": 60.0,  # `systemctl is-active nvidia-fabricmanager`: a subprocess
    "imex": 60.0,  # `systemctl is-active nvidia-imex` + `nvidia-imex-ctl -N -j`: two
}
