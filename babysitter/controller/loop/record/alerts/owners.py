"""The owner of a job alert: the job's Slurm user, from the job listing the controller already
reads every scan (JobTracker.tick), never one Slurm call per alert."""

from __future__ import annotations

from collections.abc import Iterable

from babysitter.slurm.client import SlurmJob

# jobs remembered after they left the listing: their alert resolves after they end, and the
# resolved alert must carry the same owner label (Alertmanager matches an alert by its labels)
KEPT = 20_000


class JobOwners:
    def __init__(self, kept: int = KEPT) -> None:
        self.kept = kept
        self._users: dict[int, str] = {}  # oldest listed first

    def remember(self, jobs: Iterable[SlurmJob]) -> None:
        for j in jobs:
            if j.user:
                self._users.pop(j.job_id, None)
                self._users[j.job_id] = j.user
        while len(self._users) > self.kept:
            del self._users[next(iter(self._users))]

    def __call__(self, job_id: str | None) -> str | None:
        """The user of job `job_id` (None: not listed since this controller started)."""
        try:
            return self._users.get(int(job_id or ""))
        except ValueError:
            return None  # an array task "123_4" is listed under its own id
