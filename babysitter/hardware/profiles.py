"""Hardware profiles: what a node of one GPU model should look like, in one table. The GPU, IB and
NCCL checks read the node's profile (babysitter.checks.profile picks it: the model NVML
reports, or `[agent] hardware_profile`; single values are overridden per check). Facts about
the hardware only: when a reading is a fault is each check's own threshold (checks/<name>/).

Sources: Azure HPC health checks (memory limits, bus bandwidth), gpud, NVIDIA docs; see the
domain notes. A model without a figure here gets the generic value.
"""

from __future__ import annotations

import re

import msgspec


class HardwareProfile(msgspec.Struct, frozen=True):
    name: str
    description: str
    # NVML device names this profile is detected from (None: never detected, chosen by name)
    detect: re.Pattern[str] | None
    nvlinks: int = 0  # NVLinks per GPU (0: no expectation; an inactive link is critical)
    # GPUs per node; required only when the profile is configured (a board name does not say
    # how many of them the node has)
    gpu_count: int | None = None
    ib_ports: int = 0  # InfiniBand ports ACTIVE per node (0: no expectation)
    ib_rate_gbps: float | None = None  # rate each port must run at (None: the node's best port)
    nccl_busbw_gbps: float = 150.0  # all_reduce_perf bus bandwidth floor at the largest size
    # the GPUs' NVLinks go through NVSwitches: NVML's GPU fabric state must be COMPLETED
    # before a multi-GPU job can run (gpu.fabric reads it)
    nvswitch: bool = False
    # the node itself runs the `nvidia-fabricmanager` service that trains that fabric (HGX
    # boards; on NVL72 racks Fabric Manager runs on the switch trays, not the compute nodes)
    fabric_manager: bool = False
    # the node is one of several in a multi-node NVLink domain and needs the IMEX daemon
    # (`nvidia-imex`); only ever checked on a configured profile (a single GB200 tray is not
    # a multi-node domain, and IMEX alarms there are false: NVSentinel#1471)
    imex: bool = False


def _hgx(
    name: str, description: str, detect: str, nvlinks: int, ib: tuple[int, float], busbw: float
) -> HardwareProfile:
    return HardwareProfile(
        name,
        description,
        re.compile(detect, re.IGNORECASE),
        nvlinks=nvlinks,
        gpu_count=8,
        ib_ports=ib[0],
        ib_rate_gbps=ib[1],
        nccl_busbw_gbps=busbw,
        nvswitch=True,
        fabric_manager=True,
    )


def _nvl72(name: str, description: str, detect: str, busbw: float) -> HardwareProfile:
    """A compute tray of an NVL72 rack: 4 GPUs, 18 NVLinks each into the rack's NVLink
    switch trays; the rack is one NVLink domain (cluster UUID + clique id) and needs IMEX."""
    return HardwareProfile(
        name,
        description,
        re.compile(detect, re.IGNORECASE),
        nvlinks=18,
        gpu_count=4,
        ib_ports=4,
        ib_rate_gbps=400.0,
        nccl_busbw_gbps=busbw,
        nvswitch=True,
        imex=True,
    )


# Detection goes in this order; SXM boards only (a PCIe or NVL card has neither the NVLinks
# nor, usually, the 8 rail NICs of an HGX board): other models get "generic".
PROFILES: dict[str, HardwareProfile] = {
    p.name: p
    for p in (
        _nvl72("gb300-nvl72", "GB300 NVL72 compute tray, 4 GPUs", r"\bGB300\b", 150.0),
        _nvl72("gb200-nvl72", "GB200 NVL72 compute tray, 4 GPUs", r"\bGB200\b", 150.0),
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
