"""`pyslurm` backend: Slurm's C API through pyslurm (25.11.x, which builds only against Slurm
25.11; `make setup` builds it against the devcluster's 25.11, admins build it with
SLURM_INCLUDE_DIR / SLURM_LIB_DIR, see docs/slurm.md). Reads and changes both go through libslurm:
`Nodes.load`, `Jobs.load`, `Node.modify`, `Job.requeue/modify/hold/release`, under the same
ownership rules as the other backends (OwnedClient).

pyslurm's job `state` is Slurm's job_state_string(): one word, the flag winning over the base
state, so a requeued job reads COMPLETING (not PENDING+COMPLETING) until it has run down on its
old node; `pending` is false either way.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from babysitter.slurm import hostlist
from babysitter.slurm.base import OwnedClient, classify, validate_job_id, validate_node
from babysitter.slurm.client import SlurmError, SlurmJob, SlurmNode, SlurmNotFound

T = TypeVar("T")
DEFAULT_CONF = Path("/etc/slurm/slurm.conf")

# libslurm keeps one config per process: slurm_init() with the conf in use, re-init on change
_lock = threading.RLock()
_initialized: str | None = None


def load_pyslurm(slurm_conf: Path | None = None) -> Any:
    """Import pyslurm and initialise libslurm with `slurm_conf` (else $SLURM_CONF, else the
    default path). libslurm exits the whole process when it finds no config, so a missing
    file is a SlurmError here first."""
    global _initialized
    conf = slurm_conf or (Path(os.environ["SLURM_CONF"]) if os.environ.get("SLURM_CONF") else None)
    conf = conf or DEFAULT_CONF
    if not conf.is_file():
        raise SlurmError(
            f"slurm.backend = 'pyslurm': no slurm.conf at {conf} (set slurm.slurm_conf)"
        )
    with _lock:
        os.environ.setdefault("PYSLURM_DISABLE_AUTO_INIT", "1")  # we init with our conf
        try:
            import pyslurm
        except ImportError as exc:
            raise SlurmError(
                "slurm.backend = 'pyslurm' but pyslurm is not importable "
                f"({exc}); it must be built against your Slurm (docs/slurm.md, pyslurm), "
                "or use backend 'cli' or 'rest'"
            ) from None
        if _initialized != str(conf):
            if _initialized is not None:
                pyslurm.slurm_fini()
            pyslurm.slurm_init(str(conf))
            _initialized = str(conf)
    return pyslurm


def _gres(d: Any) -> str:
    """pyslurm's gres dict ({'gpu': 8}) back to Slurm's text (gpu:8)."""
    if isinstance(d, dict):
        return ",".join(f"{k}:{v}" for k, v in d.items())
    return str(d or "")


def node_from_pyslurm(n: Any) -> SlurmNode:
    # "IDLE+DRAIN+NOT_RESPONDING": base state, then flags (node_state_string_complete)
    words = (n.state or "UNKNOWN").upper().split("+")
    return SlurmNode(
        name=n.name,
        state=words[0],
        flags=frozenset(words[1:]),
        reason=n.reason or "",
        reason_user=n.reason_user or "",
        partitions=tuple(n.partitions or ()),
        gres=_gres(n.configured_gres),
        boot_time=str(n.boot_time or ""),
    )


def job_from_pyslurm(j: Any) -> SlurmJob:
    return SlurmJob(
        job_id=int(j.id),
        name=j.name or "",
        states=((j.state or "").upper(),),
        state_reason=j.state_reason or "",
        nodes=tuple(hostlist.expand(j.allocated_nodes)),
        batch_host=j.batch_host or "",
        requeue=bool(j.is_requeueable),
        restart_count=int(j.requeue_count or 0),
        admin_comment=j.admin_comment or "",
        comment=j.comment or "",
        excluded_nodes=tuple(hostlist.expand(j.excluded_nodes)),
        user=j.user_name or "",
        partition=j.partition or "",
        work_dir=j.working_directory or "",
        stdout=j.standard_output or "",
        stderr=j.standard_error or "",
    )


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
        self.ps = module if module is not None else load_pyslurm(slurm_conf)

    def _call(self, what: str, fn: Callable[[], T]) -> T:
        """Run a libslurm call; its errors become the same typed errors as scontrol's."""
        try:
            with _lock:
                return fn()
        except self.ps.PyslurmError as exc:
            msg = str(getattr(exc, "msg", "") or exc)
            if "does not exist" in msg.lower():
                raise SlurmNotFound(f"{what}: {msg}", msg) from None
            raise classify(msg, what) from None

    def nodes(self) -> list[SlurmNode]:
        return [node_from_pyslurm(n) for n in self._call("load nodes", self.ps.Nodes.load).values()]

    def node(self, name: str) -> SlurmNode:
        validate_node(name)
        return node_from_pyslurm(self._call(f"load node {name}", lambda: self.ps.Node.load(name)))

    def jobs(self) -> list[SlurmJob]:
        return [job_from_pyslurm(j) for j in self._call("load jobs", self.ps.Jobs.load).values()]

    def job(self, job_id: int) -> SlurmJob:
        jid = validate_job_id(job_id)
        return job_from_pyslurm(self._call(f"load job {jid}", lambda: self.ps.Job.load(jid)))

    def _set_drain(self, node: str, reason: str) -> None:
        change = self.ps.Node(state="DRAIN", reason=reason)
        self._call(f"drain {node}", lambda: self.ps.Node(node).modify(change))

    def _set_resume(self, node: str) -> None:
        change = self.ps.Node(state="RESUME")
        self._call(f"resume {node}", lambda: self.ps.Node(node).modify(change))

    def _set_requeue(self, job_id: int, hold: bool) -> None:
        self._call(f"requeue {job_id}", lambda: self.ps.Job(job_id).requeue(hold=hold))

    def _set_exclude(self, job_id: int, nodes: list[str]) -> None:
        change = self.ps.JobSubmitDescription(excluded_nodes=nodes)
        self._call(f"exclude nodes for {job_id}", lambda: self.ps.Job(job_id).modify(change))

    def hold(self, job_id: int) -> None:
        jid = validate_job_id(job_id)
        self._call(f"hold {jid}", lambda: self.ps.Job(jid).hold())

    def release(self, job_id: int) -> None:
        jid = validate_job_id(job_id)
        self._call(f"release {jid}", lambda: self.ps.Job(jid).release())
