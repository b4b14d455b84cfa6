"""`cli` backend: Slurm's own commands. Reads with `--json` where the version has it
(22.05: sinfo/squeue --json, which ignore -n/-j filters; 23.02+: scontrol show --json), writes
with scontrol."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from functools import cached_property

from babysitter.slurm import parse
from babysitter.slurm.base import OwnedClient, parsed, validate_job_id
from babysitter.slurm.client import SlurmError, SlurmJob, SlurmNode, SlurmNotFound

# `scontrol show node -o NAMES` takes a comma list; keep each argv well below ARG_MAX
LOOKUP_BATCH = 2000
_REASON_USER = re.compile(r"^(.*?)\s*\[([^@\]]+)@[^\]]*\]$")


def _value(head: str, key: str) -> str | None:
    """The value of ` KEY=` in a node line head (None if absent); values hold no spaces."""
    i = head.find(key)
    if i < 0:
        return None
    i += len(key)
    j = head.find(" ", i)
    return head[i:] if j < 0 else head[i:j]


def node_line(line: str) -> SlurmNode:
    """One `scontrol show node -o` line, reading only the keys SlurmNode holds (the general
    parse.node_from_scontrol splits all ~40 keys: 1.9 s for 10,000 nodes here; a regex over
    each line 0.3 s; these four finds a fraction of that). Same result, checked against it in
    tests/test_slurm_budget.py."""
    cut = line.find(" Reason=")
    head, reason = (line, "") if cut < 0 else (line[:cut], line[cut + 8 :].strip())
    if not head.startswith("NodeName="):
        raise ValueError(f"not a node line: {line[:80]!r}")
    head = " " + head
    state = _value(head, " State=") or "UNKNOWN"
    words = [w for w in state.upper().split("+") if w]
    flags = set(words[1:])
    if state.endswith("*"):
        flags.add("NOT_RESPONDING")
    user = ""
    m = _REASON_USER.match(reason)
    if m:
        reason, user = m.group(1), m.group(2)
    parts = _value(head, " Partitions=") or ""
    return SlurmNode(
        name=_value(head, " NodeName=") or "",
        state=words[0].rstrip("*") if words else "UNKNOWN",
        flags=frozenset(flags),
        reason="" if reason == "(null)" else reason,
        reason_user=user,
        partitions=tuple(p for p in parts.split(",") if p and p != "(null)"),
        gres=_value(head, " Gres=") or "",
        boot_time=_value(head, " BootTime=") or "",
    )


class CliSlurmClient(OwnedClient):
    """Takes OwnedClient's arguments: reason_prefix, slurm_conf, bin_dir, timeout_s."""

    @cached_property
    def version(self) -> tuple[int, int]:
        return parse.parse_version(self.sc.run("scontrol", "--version", what="scontrol --version"))

    def _json(self, *argv: str) -> dict:
        out = self.sc.run(*argv)
        try:
            doc = json.loads(out)
        except json.JSONDecodeError as exc:
            raise SlurmError(f"{' '.join(argv[:3])}: not JSON: {exc}", out[:200]) from None
        if not isinstance(doc, dict):
            raise SlurmError(f"{' '.join(argv[:3])}: unexpected JSON", out[:200])
        errs = parse.errors_of(doc)
        if errs and not (doc.get("nodes") or doc.get("jobs")):
            raise SlurmError(f"{' '.join(argv[:3])}: {'; '.join(errs)}", "; ".join(errs))
        return doc

    def nodes(self) -> list[SlurmNode]:
        if self.version >= (23, 2):
            return parsed(
                parse.nodes_from_json, self._json("scontrol", "show", "node", "--json"), "nodes"
            )
        # 22.05: `scontrol show node -o`, not `sinfo --json`: the same two RPCs for slurmctld
        # (node + partition info) but at 10,000 nodes 0.35 s and 5 MB of text here instead
        # of 1.9 s and 12 MB of JSON (measured, notes: slurm-10k-nodes.md)
        return self._oneliners()

    def _oneliners(self, *names: str) -> list[SlurmNode]:
        try:
            out = self.sc.run(
                "scontrol", "show", "node", "-o", *names, what="show node", partial_ok=True
            )
        except SlurmNotFound:
            return []  # none of `names` exists
        # a full listing reuses the nodes of the lines unchanged since the previous one (most
        # of them, between two snapshots a few seconds apart)
        cache: dict[str, SlurmNode] = {} if names else getattr(self, "_line_cache", {})
        seen: dict[str, SlurmNode] = {}
        nodes = []
        for line in out.splitlines():
            if line.startswith("NodeName="):
                node = cache.get(line)
                if node is None:
                    try:
                        node = node_line(line)
                    except ValueError as exc:
                        raise SlurmError(f"show node: {exc}", line[:200]) from None
                seen[line] = node
                nodes.append(node)
        if not nodes and not names:
            raise SlurmError("show node: no nodes in the output", out[:200])
        if not names:
            self._line_cache = seen
        return nodes

    def nodes_named(self, names: Sequence[str]) -> dict[str, SlurmNode]:
        """One `scontrol show node -o a,b,c` (slurmctld: one node-info RPC, whatever the
        count; unknown names are reported on stderr and left out)."""
        out: dict[str, SlurmNode] = {}
        names = list(dict.fromkeys(names))
        for k in range(0, len(names), LOOKUP_BATCH):
            for n in self._oneliners(",".join(names[k : k + LOOKUP_BATCH])):
                out[n.name] = n
        return out

    def jobs(self) -> list[SlurmJob]:
        if self.version >= (23, 2):
            return parsed(
                parse.jobs_from_json, self._json("scontrol", "show", "job", "--json"), "jobs"
            )
        return parsed(parse.jobs_from_json, self._json("squeue", "--json"), "jobs")

    def job(self, job_id: int) -> SlurmJob:
        jid = validate_job_id(job_id)
        for j in self.jobs():
            if j.job_id == jid:
                return j
        # finished jobs drop out of squeue but scontrol still knows them for MinJobAge
        out = self.sc.run("scontrol", "show", "job", "-o", str(jid), what=f"show job {jid}")
        line = out.strip().splitlines()[0] if out.strip() else ""
        if not line:
            raise SlurmNotFound(f"Invalid job id specified for job {jid}")
        return parse.job_from_scontrol(line)
