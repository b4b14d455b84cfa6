"""What every step of the controller's loop works with: the settings, the store, the Slurm
client and the loop's latest listing of Slurm. The remediation engine builds one and hands it
to each step (healer, fabric, SDC schedule), so a step's constructor names only what is its
own."""

from __future__ import annotations

from dataclasses import dataclass

from babysitter.config import Config
from babysitter.controller.db.store import Store
from babysitter.controller.loop.read.snapshot import SlurmSnapshot
from babysitter.slurm.client import SlurmClient


@dataclass(frozen=True)
class LoopContext:
    cfg: Config
    store: Store
    slurm: SlurmClient
    snapshot: SlurmSnapshot
