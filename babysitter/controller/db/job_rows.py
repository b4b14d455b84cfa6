"""The jobs table as the tick's requeue run reads and writes it (issue 52): the rows of the
run's jobs in one read, remembered by the tick, and what the run saved in one statement (a
rack's requeues cost the statements of one job's)."""

from __future__ import annotations

from typing import Any, cast

from sqlalchemy import select

from babysitter.controller.db import models as m
from babysitter.controller.db import store as clock
from babysitter.controller.db.store import JobRow, Store, aware
from babysitter.controller.db.upsert import clamped, upsert_many


def job_rows(store: Store, job_ids: list[int]) -> dict[int, JobRow]:
    """The rows of these jobs (a job without one is left out); inside the tick, those read
    since the jobs table was last written are not read again."""

    def read(keys: list[tuple[str, int]]) -> dict[tuple[str, int], JobRow]:
        q = select(m.jobs).where(m.jobs.c.job_id.in_([k[1] for k in keys]))
        with store.reading() as c:
            rows = [r._asdict() for r in c.execute(q)]
        out = {}
        for r in rows:
            r["first_seen_at"] = aware(r["first_seen_at"])
            r["updated_at"] = aware(r["updated_at"])
            out[("job", int(r["job_id"]))] = cast(JobRow, r)
        return out

    got = store.reads.read_many(("jobs",), [("job", i) for i in job_ids], read)
    # copies: a caller's changes to a row are not the tick's memory of it
    return {k[1]: cast(JobRow, dict(v)) for k, v in got.items()}


def upsert_jobs(store: Store, rows: list[tuple[int, dict[str, Any]]]) -> None:
    """`Store.upsert_job` of each (job, values), in one transaction and one statement for
    each set of columns."""
    ts = clock.now()  # Store.upsert_job's clock (a simulation sets it)
    values = [(job_id, {**clamped(m.jobs, v), "updated_at": ts}) for job_id, v in rows]
    with store.engine.begin() as c:
        upsert_many(c, m.jobs, "job_id", values, lambda cols: m.new_job_columns(cols, ts))
