"""`rest` backend: slurmrestd over a unix socket (rest_auth/local) or TCP with a JWT.

Discovers the newest OpenAPI version the server answers (probing newest first: v0.0.44 on
25.11, v0.0.45 on 26.05), reads nodes/jobs over REST, and does changes over REST where that
version has them (node update and job ExcNodeList from v0.0.40, i.e. Slurm 24.11; requeue, held
or not, from v0.0.45, 26.05). Everything else falls back to scontrol (22.05's v0.0.38 has no
node update at all). `.errors` is always read: 22.05 answers 200 with `Disabled key` errors.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from functools import cached_property
from pathlib import Path
from typing import Any

import httpx
import msgspec

from babysitter.slurm import parse
from babysitter.slurm.base import OwnedClient, classify, parsed, validate_job_id
from babysitter.slurm.cli import LOOKUP_BATCH, node_line
from babysitter.slurm.client import (
    SlurmError,
    SlurmJob,
    SlurmNode,
    SlurmNotFound,
    SlurmRejected,
    SlurmUnavailable,
)

# newest first; probing stops at the first one the server serves
API_VERSIONS = [f"v0.0.{n}" for n in range(45, 37, -1)]


def _vnum(version: str) -> int:
    return int(version.rsplit(".", 1)[-1])


class _NodeFields(msgspec.Struct):
    """The keys of a node record that parse.node_from_json reads (typed loosely: they differ
    between versions). The other ~55 keys of each record are skipped by the decoder."""

    name: Any = None
    hostname: Any = None
    state: Any = None
    state_flags: Any = None
    reason: Any = None
    reason_set_by_user: Any = None
    partitions: Any = None
    gres: Any = None
    boot_time: Any = None


class _NodesDoc(msgspec.Struct):
    nodes: list[_NodeFields] | None = None
    errors: Any = None


def _decode_nodes(raw: bytes) -> Any:
    """The /nodes answer, decoded into only the keys babysitter reads. At 10,000 nodes it is
    12.6 MB; json.loads built every key of every record in one call that held the GIL for
    70-140 ms (every node_refresh_s), stalling the controller's HTTP loop for as long.
    Anything of another shape is decoded in full and left to the general checks."""
    try:
        doc = msgspec.json.decode(raw, type=_NodesDoc)
    except msgspec.MsgspecError:
        return json.loads(raw)
    out: dict[str, Any] = {"errors": doc.errors}
    if doc.nodes is not None:
        out["nodes"] = [msgspec.structs.asdict(n) for n in doc.nodes]
    return out


class RestSlurmClient(OwnedClient):
    def __init__(
        self,
        url: str,
        reason_prefix: str = "babysitter:",
        jwt_token: str | None = None,
        user: str = "root",
        slurm_conf: Path | None = None,
        bin_dir: Path | None = None,
        timeout_s: float = 15.0,
    ) -> None:
        super().__init__(reason_prefix, slurm_conf, bin_dir, timeout_s)
        self.timeout_s = timeout_s
        headers = {}
        if jwt_token:
            headers = {"X-SLURM-USER-NAME": user, "X-SLURM-USER-TOKEN": jwt_token}
        if url.startswith("unix://"):
            transport = httpx.HTTPTransport(uds=url[len("unix://") :])
            self.http = httpx.Client(
                transport=transport,
                base_url="http://slurmrestd",
                timeout=timeout_s,
                headers=headers,
            )
        else:
            self.http = httpx.Client(base_url=url.rstrip("/"), timeout=timeout_s, headers=headers)

    def _request(
        self,
        method: str,
        path: str,
        body: Any = None,
        decode: Callable[[bytes], Any] | None = None,
    ) -> dict[str, Any]:
        what = f"{method} {path}"
        try:
            r = self.http.request(method, path, json=body)
        except httpx.TimeoutException:
            raise SlurmUnavailable(f"{what}: no answer within {self.timeout_s:g} s") from None
        except httpx.TransportError as exc:
            raise SlurmUnavailable(f"{what}: slurmrestd unreachable: {exc}") from None
        try:
            doc = decode(r.content) if decode is not None else r.json()
        except ValueError:
            doc = {}
        if not isinstance(doc, dict):
            doc = {}
        errs = parse.errors_of(doc)
        if r.status_code >= 500 and not errs:
            raise SlurmUnavailable(f"{what}: HTTP {r.status_code}", r.text[:200])
        if r.status_code == 404 and not errs:
            raise SlurmNotFound(f"{what}: not found", r.text[:200])
        if r.status_code >= 400 or errs:
            msg = "; ".join(errs) or f"HTTP {r.status_code} {r.text[:200]}"
            low = msg.lower()
            if "invalid job id" in low or "unable to query" in low or "not found" in low:
                raise SlurmNotFound(f"{what}: {msg}", msg)
            raise SlurmRejected(f"{what}: {msg}", msg)
        return doc

    @cached_property
    def api_version(self) -> str:
        for v in API_VERSIONS:
            try:
                r = self.http.get(f"/slurm/{v}/ping")
            except httpx.TimeoutException:
                raise SlurmUnavailable("slurmrestd: ping timed out") from None
            except httpx.TransportError as exc:
                raise SlurmUnavailable(f"slurmrestd unreachable: {exc}") from None
            if r.status_code == 200:
                return v
        raise SlurmError("slurmrestd serves none of the OpenAPI versions babysitter knows")

    @property
    def has_node_update(self) -> bool:
        return _vnum(self.api_version) >= 40

    @property
    def has_requeue(self) -> bool:
        return _vnum(self.api_version) >= 45

    def nodes(self) -> list[SlurmNode]:
        doc = self._request("GET", f"/slurm/{self.api_version}/nodes", decode=_decode_nodes)
        return parsed(parse.nodes_from_json, doc, "nodes")

    def nodes_named(self, names: Sequence[str]) -> dict[str, SlurmNode]:
        """Where node changes go through scontrol (before v0.0.40), so does the ownership
        re-check right before them: `scontrol show node -o a,b,c` is one small lookup, where
        this version's REST has only the full listing (12 MB of JSON at 10,000 nodes: seconds
        under load, and it timed drains out while the snapshot thread listed too)."""
        if self.has_node_update:
            return super().nodes_named(names)
        out: dict[str, SlurmNode] = {}
        names = list(dict.fromkeys(names))
        for k in range(0, len(names), LOOKUP_BATCH):
            try:
                text = self.sc.run(
                    "scontrol",
                    "show",
                    "node",
                    "-o",
                    ",".join(names[k : k + LOOKUP_BATCH]),
                    what="show node",
                    partial_ok=True,
                )
            except SlurmNotFound:
                continue  # none of them exists
            for line in text.splitlines():
                if line.startswith("NodeName="):
                    try:
                        node = node_line(line)
                    except ValueError as exc:
                        raise SlurmError(f"show node: {exc}", line[:200]) from None
                    out[node.name] = node
        return out

    def jobs(self) -> list[SlurmJob]:
        return parsed(
            parse.jobs_from_json, self._request("GET", f"/slurm/{self.api_version}/jobs"), "jobs"
        )

    def job(self, job_id: int) -> SlurmJob:
        jid = validate_job_id(job_id)
        doc = self._request("GET", f"/slurm/{self.api_version}/job/{jid}")
        jobs = [j for j in parse.jobs_from_json(doc) if j.job_id == jid]
        if not jobs:
            raise SlurmNotFound(f"Invalid job id specified for job {jid}")
        return jobs[0]

    def _set_drain(self, node: str, reason: str) -> None:
        if self.has_node_update:
            self._request(
                "POST",
                f"/slurm/{self.api_version}/node/{node}",
                {"state": ["DRAIN"], "reason": reason},
            )
        else:
            super()._set_drain(node, reason)

    def _set_resume(self, node: str) -> None:
        if self.has_node_update:
            self._request("POST", f"/slurm/{self.api_version}/node/{node}", {"state": ["RESUME"]})
        else:
            super()._set_resume(node)

    def _set_drain_many(self, nodes: list[str], reason: str) -> None:
        if self.has_node_update:  # one POST per node: the path takes one name
            for n in nodes:
                self._set_drain(n, reason)
        elif len(nodes) > 1:  # scontrol, as the base does: one update RPC for all of them
            self.sc.drain(",".join(nodes), reason)
        else:
            super()._set_drain(nodes[0], reason)

    def _set_resume_many(self, nodes: list[str]) -> None:
        if self.has_node_update:
            for n in nodes:
                self._set_resume(n)
        elif len(nodes) > 1:
            self.sc.resume(",".join(nodes))
        else:
            super()._set_resume(nodes[0])

    def _set_requeue(self, job_id: int, hold: bool) -> None:
        """v0.0.45 (26.05): POST jobs/requeue, `flags: ["Hold"]` for a held one. Its answer
        reports each job's outcome in `status` (error_code, error), not only in `.errors`."""
        if not self.has_requeue:
            super()._set_requeue(job_id, hold)
            return
        body: dict[str, Any] = {"jobs": [str(job_id)]}
        if hold:
            body["flags"] = ["Hold"]
        doc = self._request("POST", f"/slurm/{self.api_version}/jobs/requeue", body)
        for entry in _entries(doc.get("status")):
            if entry.get("error_code"):
                msg = str(entry.get("error") or entry.get("why") or entry["error_code"])
                raise classify(msg, f"requeue {job_id}")

    def _set_exclude(self, job_id: int, nodes: list[str]) -> None:
        if self.has_node_update:
            self._request(
                "POST", f"/slurm/{self.api_version}/job/{job_id}", {"excluded_nodes": nodes}
            )
        else:
            super()._set_exclude(job_id, nodes)


def _entries(status: Any) -> list[dict[str, Any]]:
    """The per-job results of a v0.0.45 requeue: a list of lists of entries."""
    out: list[dict[str, Any]] = []
    for item in status if isinstance(status, list) else []:
        for e in item if isinstance(item, list) else [item]:
            if isinstance(e, dict):
                out.append(e)
    return out


def read_jwt(path: Path | None) -> str | None:
    if path is None:
        return None
    text = path.read_text().strip()
    m = re.search(r"SLURM_JWT=(\S+)", text)  # accepts `scontrol token` output as is
    return m.group(1) if m else text
