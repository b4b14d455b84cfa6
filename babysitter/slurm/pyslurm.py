"""`pyslurm` backend: optional. pyslurm on PyPI is built for Slurm 25.11 only, which no
registry reachable here ships, so this backend cannot be exercised against a live Slurm on the
test machines; it imports pyslurm lazily and fails with a clear SlurmError when unusable.
Reads go through pyslurm; changes use scontrol like the other backends (same ownership rules).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from babysitter.slurm import parse
from babysitter.slurm.base import OwnedClient, validate_job_id
from babysitter.slurm.client import SlurmError, SlurmJob, SlurmNode, SlurmNotFound


def load_pyslurm() -> Any:
    try:
        import pyslurm
    except ImportError as exc:
        raise SlurmError(
            "slurm.backend = 'pyslurm' but pyslurm is not importable "
            f"({exc}); pyslurm on PyPI needs Slurm 25.11 - use backend 'cli' or 'rest'"
        ) from None
    return pyslurm


class PyslurmSlurmClient(OwnedClient):
    def __init__(
        self,
        reason_prefix: str = "babysitter:",
        slurm_conf: Path | None = None,
        bin_dir: Path | None = None,
        timeout_s: float = 15.0,
        module: Any = None,
    ) -> None:
        super().__init__(reason_prefix, slurm_conf, bin_dir, timeout_s)
        self.ps = module if module is not None else load_pyslurm()

    def nodes(self) -> list[SlurmNode]:
        out = []
        for name, n in self.ps.Nodes.load().items():
            d = n.to_dict() if hasattr(n, "to_dict") else dict(n)
            d.setdefault("name", name)
            out.append(parse.node_from_json(d))
        return out

    def jobs(self) -> list[SlurmJob]:
        out = []
        for jid, j in self.ps.Jobs.load().items():
            d = j.to_dict() if hasattr(j, "to_dict") else dict(j)
            d.setdefault("job_id", jid)
            d.setdefault("job_state", d.get("state"))
            d.setdefault("restart_cnt", d.get("requeue_count", 0))
            out.append(parse.job_from_json(d))
        return out

    def job(self, job_id: int) -> SlurmJob:
        jid = validate_job_id(job_id)
        for j in self.jobs():
            if j.job_id == jid:
                return j
        raise SlurmNotFound(f"Invalid job id specified for job {jid}")
