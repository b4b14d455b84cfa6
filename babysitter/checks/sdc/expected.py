"""How many GPUs a validation must test, as the controller tells the validation job: the node's
Slurm gres (`Gres=gpu:h100:8(S:0-1)` -> 8), passed to `babysitter validate` in its environment
(`--gpus` reads it). A gres that names no GPU says nothing (whole-node exclusive clusters
configure none on GPU nodes): the count is then not passed, never passed as 0."""

from __future__ import annotations

import re

GPUS_ENV = "BABYSITTER_VALIDATE_GPUS"
_PARENS = re.compile(r"\([^)]*\)")


def gres_gpus(gres: str) -> int:
    """GPUs in a Slurm gres text (`gpu:8`, `gpu:a100:4,gpu:v100:2`, `gpu:8(S:0-1),mps:100`);
    0 for none (`""`, `(null)`). ValueError for a gpu entry whose count cannot be read."""
    total = 0
    for item in _PARENS.sub("", gres).split(","):
        parts = item.strip().split(":")
        if parts[0] != "gpu":
            continue
        if len(parts) == 1:
            total += 1  # `gpu` alone: one
            continue
        if not parts[-1].isdigit():
            raise ValueError(f"cannot read the GPU count of gres {gres!r}")
        total += int(parts[-1])
    return total
