"""`cli` backend: Slurm's own commands. Reads with `--json` where the version has it
(22.05: sinfo/squeue --json, which ignore -n/-j filters; 23.02+: scontrol show --json), writes
with scontrol."""

from __future__ import annotations

import json
from functools import cached_property

from babysitter.slurm import parse
from babysitter.slurm.base import OwnedClient, parsed, validate_job_id
from babysitter.slurm.client import SlurmError, SlurmJob, SlurmNode, SlurmNotFound


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
        return parsed(parse.nodes_from_json, self._json("sinfo", "--json"), "nodes")

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
