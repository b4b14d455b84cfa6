"""The fault a remediation rung is for, reduced to what the ledger keeps of it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from babysitter.finding import Action, Finding


@dataclass(frozen=True)
class Fault:
    """The finding a rung is for, reduced to what the ledger keeps."""

    klass: str
    action: Action
    summary: str
    gpu_uuid: str | None
    gpu_serial: str | None
    bus_id: str | None

    @classmethod
    def of(cls, f: Finding) -> Fault:
        d = f.details or {}
        return cls(
            klass=f.code,
            action=f.action,
            summary=f"{f.check}: {f.message}"[:300],
            gpu_uuid=_text(d.get("uuid")),
            gpu_serial=_text(d.get("serial")),
            bus_id=_text(d.get("pci_bus_id") or d.get("pci")),
        )

    def common(self) -> dict[str, Any]:
        """What every ledger row of this fault carries (the GPU and the evidence it starts
        with); a fresh dict each time: the rung's steps add to its evidence."""
        return {
            "gpu_uuid": self.gpu_uuid,
            "gpu_serial": self.gpu_serial,
            "evidence": {"action": self.action.value, "bus_id": self.bus_id},
        }


def _text(v: Any) -> str | None:
    return str(v)[:96] if v else None
