"""The node's hardware profile, and what the GPU, IB and NCCL checks expect from it.

The profile is `[agent] hardware_profile` when set (configured), else the one of the GPU model
NVML reports (detected), else "generic". Single values are overridden where a check's settings
live (`[checks.gpu] expected_count` / `thresholds.expected_nvlinks`, `[checks.infiniband]
expected_ports` / `expected_rate_gbps`, `[checks.nccl] min_busbw_gbps`).

A configured profile is a promise about the node: a missing InfiniBand fabric or too few GPUs
are faults. A detected one says only what the GPU model implies (NVLinks, thermal margin, the
rate and number of IB ports when the node has IB at all, the NCCL floor): a GPU's name does not
prove the node was built with 8 GPUs and an IB fabric.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import TYPE_CHECKING, Literal

import msgspec

from babysitter.hardware.profiles import PROFILES, HardwareProfile, detect

if TYPE_CHECKING:
    from babysitter.config import Config

# when NVML could not name the GPUs, try again after this long (the driver may load late)
REDETECT_S = 300.0


class Expectations(msgspec.Struct, frozen=True):
    profile: str
    source: Literal["configured", "detected"]
    nvlinks: int  # NVLinks per GPU the model has (0: no expectation)
    gpu_count: int | None  # GPUs the node must have (None: no expectation)
    ib_ports: int  # ACTIVE InfiniBand ports expected (0: none)
    ib_rate_gbps: float | None  # rate each port must run at (None: the node's best port)
    ib_required: bool  # no InfiniBand device at all is a fault (else the IB check stays off)
    nccl_busbw_gbps: float
    nvswitch: bool  # NVML's GPU fabric state applies (gpu.fabric reads it)
    # the node runs nvidia-fabricmanager: configured profile, or `[checks.fabric]
    # fabric_manager`; on a detected profile gpu.fabric also asks the driver (a GPU in a fabric)
    fabric_manager: bool | None
    imex: bool  # the node needs nvidia-imex (a configured profile or `[checks.fabric] imex`)


def expectations(cfg: Config, gpu_name: str | None) -> Expectations:
    """The profile (configured, else detected from `gpu_name`) with the per-check overrides."""
    name = cfg.agent.hardware_profile
    profile: HardwareProfile = PROFILES[name] if name else detect(gpu_name)
    configured = name is not None
    gpu, ib, nccl = cfg.checks.gpu, cfg.checks.infiniband, cfg.checks.nccl
    fab = cfg.checks.fabric
    if fab.fabric_manager is not None:
        fabric_manager: bool | None = fab.fabric_manager
    else:
        # detected: a board that may run Fabric Manager does when its GPUs report a fabric
        fabric_manager = (
            profile.fabric_manager if configured or not profile.fabric_manager else None
        )
    if gpu.expected_count is not None:
        gpu_count: int | None = gpu.expected_count
    else:
        gpu_count = profile.gpu_count if configured else None
    return Expectations(
        profile=profile.name,
        source="configured" if configured else "detected",
        nvlinks=profile.nvlinks,
        gpu_count=gpu_count,
        ib_ports=profile.ib_ports if ib.expected_ports is None else ib.expected_ports,
        ib_rate_gbps=ib.expected_rate_gbps or profile.ib_rate_gbps,
        ib_required=configured or ib.expected_ports is not None,
        nccl_busbw_gbps=nccl.min_busbw_gbps or profile.nccl_busbw_gbps,
        nvswitch=profile.nvswitch,
        fabric_manager=fabric_manager,
        imex=fab.imex if fab.imex is not None else configured and profile.imex,
    )


def gpu_model() -> str | None:
    """The most common GPU name on this node (None without NVML or GPUs)."""
    from babysitter.checks import nvml  # pynvml: only when detecting

    try:
        devs, _ = nvml.devices(max_age_s=60.0)
    except nvml.NvmlUnavailable:
        return None
    names = Counter(d.name for d in devs)
    return names.most_common(1)[0][0] if names else None


class NodeProfile:
    """The node's Expectations for the checks, read once (a configured profile never touches
    NVML; a detection that found no GPU is retried every REDETECT_S)."""

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self._value: Expectations | None = None
        self._retry_at = 0.0

    def get(self) -> Expectations:
        value = self._value
        if value is None or (self._retry_at and time.monotonic() >= self._retry_at):
            model = None if self.cfg.agent.hardware_profile else gpu_model()
            value = self._value = expectations(self.cfg, model)
            undetected = value.source == "detected" and model is None
            self._retry_at = time.monotonic() + REDETECT_S if undetected else 0.0
        return value
