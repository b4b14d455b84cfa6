"""Which `dcgmi diag -r` level a validation asks for: by what was done to the node (a GPU reset,
a reboot, nothing but a cleared fault) and by the fault (a memory fault gets at least
`[validation] dcgm_memory_fault`). 0: no DCGM diagnostic. The node runs it only where DCGM is
installed (babysitter validate)."""

from __future__ import annotations

from babysitter.checks.dcgm.diag import LEVEL_ENV
from babysitter.config import ValidationConfig

__all__ = ["LEVEL_ENV", "level_for", "memory_fault"]
# finding codes of memory faults: ECC, row remapping, and the memory XIDs of NVIDIA's catalog
# (48 DBE, 63/64 row remap, 92 high SBE rate, 94/95 contained/uncontained ECC, 140 unrecovered)
MEMORY_PREFIXES = ("ecc.", "row_remap", "retired_pages")
MEMORY_XIDS = frozenset({48, 63, 64, 92, 94, 95, 140})


def memory_fault(fault_class: str | None) -> bool:
    fc = fault_class or ""
    if fc.startswith(MEMORY_PREFIXES):
        return True
    head, _, num = fc.partition(".")
    return head == "xid" and num.isdigit() and int(num) in MEMORY_XIDS


def level_for(cfg: ValidationConfig, rung: str | None, fault_class: str | None) -> int:
    """`rung`: the remediation rung just done ("reset_gpu", "reboot"), None for a validation
    after a fault that cleared on its own."""
    base = {"reset_gpu": cfg.dcgm_after_reset, "reboot": cfg.dcgm_after_reboot}.get(
        rung or "", cfg.dcgm_other
    )
    if memory_fault(fault_class):
        return max(base, cfg.dcgm_memory_fault)
    return base
