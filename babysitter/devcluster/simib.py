"""A generated InfiniBand sysfs tree (`<root>/sys/class/infiniband/<dev>/ports/<n>/`) for tests,
the demo and the agent-cost benchmark; the check reads it exactly like the real one."""

from __future__ import annotations

import os
from pathlib import Path

COUNTERS = (
    "symbol_error",
    "link_error_recovery",
    "link_downed",
    "port_rcv_errors",
    "port_rcv_remote_physical_errors",
    "port_rcv_switch_relay_errors",
    "port_xmit_discards",
    "port_xmit_constraint_errors",
    "port_rcv_constraint_errors",
    "local_link_integrity_errors",
    "excessive_buffer_overrun_errors",
    "VL15_dropped",
    "port_xmit_data",
    "port_rcv_data",
    "port_xmit_packets",
    "port_rcv_packets",
)
RATE_TEXT = {400: "400 Gb/sec (4X NDR)", 200: "200 Gb/sec (4X HDR)", 100: "100 Gb/sec (4X EDR)"}


def port_dir(root: Path, dev: str, port: int = 1) -> Path:
    return Path(root) / "sys" / "class" / "infiniband" / dev / "ports" / str(port)


def _write(p: Path, text: str) -> None:
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(f".{p.name}.tmp")
    tmp.write_text(text + "\n")
    os.replace(tmp, p)


def make_tree(root: Path, devices: int = 8, rate_gbps: int = 400, lid_base: int = 1) -> list[str]:
    names = [f"mlx5_{i}" for i in range(devices)]
    for i, dev in enumerate(names):
        set_port(root, dev, 1, active=True, rate_gbps=rate_gbps)
        # where the port sits: its LID, the subnet manager's (LID 1) and GID 0
        d = port_dir(root, dev, 1)
        _write(d / "lid", f"0x{lid_base + 1 + i:x}")
        _write(d / "sm_lid", "0x1")
        _write(d / "gids" / "0", f"fe80:0000:0000:0000:0c42:a103:00{lid_base:02x}:{i:04x}")
        for c in COUNTERS:
            set_counter(root, dev, 1, c, 0)
    return names


def set_port(
    root: Path, dev: str, port: int = 1, *, active: bool | None = None, rate_gbps: int | None = None
) -> None:
    d = port_dir(root, dev, port)
    if active is not None:
        _write(d / "state", "4: ACTIVE" if active else "1: DOWN")
        _write(d / "phys_state", "5: LinkUp" if active else "3: Disabled")
    if rate_gbps is not None:
        _write(d / "rate", RATE_TEXT.get(rate_gbps, f"{rate_gbps} Gb/sec (4X)"))


def set_counter(root: Path, dev: str, port: int, name: str, value: int) -> None:
    _write(port_dir(root, dev, port) / "counters" / name, str(value))


def bump_counter(root: Path, dev: str, port: int, name: str, by: int = 1) -> None:
    p = port_dir(root, dev, port) / "counters" / name
    cur = int(p.read_text().strip()) if p.exists() else 0
    set_counter(root, dev, port, name, cur + by)
