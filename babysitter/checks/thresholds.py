"""GPU health thresholds as data, per SKU profile. A site overrides any value in
`[checks.gpu] thresholds = {name = value}`; the profile is chosen from the device name unless
`[checks.gpu] profile` names one.

Sources: Azure HPC health checks (H100 memory limits), gpud, NVIDIA docs; see domain notes.
"""

from __future__ import annotations

from typing import Any

DEFAULT: dict[str, float] = {
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
    # NVLink: error counter increase per check interval that is worth a warning
    "nvlink_error_delta_warn": 100,
}

PROFILES: dict[str, dict[str, float]] = {
    "default": {},
    "H100": {"expected_nvlinks": 18},
    "H200": {"expected_nvlinks": 18},
    "B200": {"expected_nvlinks": 18},
    "A100": {"expected_nvlinks": 12},
}


def profile_name(device_name: str) -> str:
    up = device_name.upper()
    for name in ("H200", "H100", "B200", "A100"):
        if name in up:
            return name
    return "default"


def thresholds_for(
    device_name: str, profile: str | None, overrides: dict[str, Any]
) -> dict[str, float]:
    name = profile or profile_name(device_name)
    t = dict(DEFAULT)
    t.update(PROFILES.get(name, {}))
    t.update({k: float(v) for k, v in overrides.items()})
    return t
