"""Hardware profiles: what a node of one GPU model should look like, in one table. The GPU, IB and
NCCL checks compare against the node's profile (babysitter.checks.profile picks it: the model
NVML reports, or `[agent] hardware_profile`; single values are overridden per check).

Sources: Azure HPC health checks (memory limits, bus bandwidth), gpud, NVIDIA docs; see the
domain notes. A model without a figure here gets the generic value.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

# GPU thresholds by name; `[checks.gpu] thresholds = {name = value}` overrides any of them.
GPU_THRESHOLDS: Mapping[str, float] = {
    # ECC
    "dbe_volatile_max": 0,  # any volatile uncorrectable error is critical (Azure HPC)
    "dbe_aggregate_max": 0,  # historic DBEs: warning, the GPU has had a bad day before
    "sbe_volatile_warn": 10_000,  # SRAM correctable > 10,000 -> warning (Azure HPC)
    # page retirement (pre-Ampere) and row remapping (Ampere+)
    "retired_pages_max": 61,  # >= 62 retired pages -> critical (Azure HPC)
    "remap_uncorrectable_max": 512,  # > 512 uncorrectable remaps -> critical (Azure HPC)
    # thermals: margin below the board's own slowdown threshold that warns early
    "temp_warn_margin_c": 5,
    # PCIe
    "pcie_width_min_fraction": 1.0,  # any narrower link than max is degraded
    # NVLink: links each GPU must have up (0: no expectation; links past it only warn) and the
    # error counter increase per check interval that is worth a warning
    "expected_nvlinks": 0,
    "nvlink_error_delta_warn": 100,
}


@dataclass(frozen=True)
class HardwareProfile:
    name: str
    description: str
    # NVML device names this profile is detected from (None: never detected, chosen by name)
    detect: re.Pattern[str] | None
    gpu: Mapping[str, float] = field(default_factory=lambda: dict(GPU_THRESHOLDS))
    # GPUs per node; required only when the profile is configured (a board name does not say
    # how many of them the node has)
    gpu_count: int | None = None
    ib_ports: int = 0  # InfiniBand ports ACTIVE per node (0: no expectation)
    ib_rate_gbps: float | None = None  # rate each port must run at (None: the node's best port)
    nccl_busbw_gbps: float = 150.0  # all_reduce_perf bus bandwidth floor at the largest size


def _hgx(
    name: str, description: str, detect: str, nvlinks: int, ib: tuple[int, float], busbw: float
) -> HardwareProfile:
    return HardwareProfile(
        name,
        description,
        re.compile(detect, re.IGNORECASE),
        gpu={**GPU_THRESHOLDS, "expected_nvlinks": nvlinks},
        gpu_count=8,
        ib_ports=ib[0],
        ib_rate_gbps=ib[1],
        nccl_busbw_gbps=busbw,
    )


# Detection goes in this order; SXM boards only (a PCIe or NVL card has neither the NVLinks
# nor, usually, the 8 rail NICs of an HGX board): other models get "generic".
PROFILES: dict[str, HardwareProfile] = {
    p.name: p
    for p in (
        _hgx("b200", "HGX B200, 8 GPUs", r"\bB200\b", 18, (8, 400.0), 150.0),
        _hgx("h200-sxm", "HGX H200, 8 GPUs", r"\bH200\b(?!.*NVL)", 18, (8, 400.0), 431.0),
        _hgx("h100-sxm", "HGX H100, 8 GPUs", r"\bH100\b(?!.*(PCIe|NVL))", 18, (8, 400.0), 460.0),
        _hgx("a100-sxm", "HGX A100, 8 GPUs", r"\bA100-SXM", 12, (1, 200.0), 228.0),
        HardwareProfile("generic", "any other GPU, or none", None),
    )
}
GENERIC = PROFILES["generic"]


def detect(gpu_name: str | None) -> HardwareProfile:
    """The profile of a GPU model, from the name NVML reports ("NVIDIA H100 80GB HBM3")."""
    if gpu_name:
        for p in PROFILES.values():
            if p.detect is not None and p.detect.search(gpu_name):
                return p
    return GENERIC
