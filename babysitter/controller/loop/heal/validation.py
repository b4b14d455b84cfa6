"""Validation before a node returns (HyperPod / cluster-health-scanner style): when a drained
node's fault clears, the policy decides `validate` instead of `resume`; this module runs
`babysitter validate` on the node as a Slurm job and turns its outcome into the node's fate.

How the job can run on a node nobody else may use: Slurm never starts a job on a DRAINED node,
not even in a reservation (checked on 22.05). So babysitter first creates a MAINT reservation
on the node for the admin user, then resumes the node *inside* it: only the validation job can
start there. Pass -> the reservation is deleted and the node is back in service. Fail -> the
node is drained again (`babysitter: validation failed: ...`) and on-call is told; after
`validation.max_attempts` failures in the node's drain episode (every babysitter drain starts
one: controller/db/episodes.py) it waits for an admin (lemon alert). Only a readable verdict
saying ok, with the devices it tested, passes (`verdict_failure`).

Each validation is an action of kind `validate` (status running -> done | failed, job id,
outcome), so it shows in `/api/v1/actions`, `babysitter status` and the node history.
"""

from __future__ import annotations

import json
import logging
import os
import shlex
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from babysitter.checks.sdc.expected import GPUS_ENV, gres_gpus
from babysitter.config import Config
from babysitter.controller.db import audit
from babysitter.controller.db.actions import Action, ActionKind, ActionStatus
from babysitter.controller.db.episodes import NodeValidation, validation_history
from babysitter.controller.db.store import Store
from babysitter.controller.loop.admit.admission import Act, Admission, Refusal, Why
from babysitter.controller.loop.admit.gate import AdmittedSlurm
from babysitter.controller.loop.decide.diag_level import LEVEL_ENV, level_for
from babysitter.controller.loop.decide.node.rules import Rule
from babysitter.controller.loop.read.ledger import Ledger
from babysitter.controller.loop.record.alerts import Alert
from babysitter.finding import Severity
from babysitter.slurm.client import (
    SlurmClient,
    SlurmError,
    SlurmNodeSettling,
    SlurmNotFound,
    SlurmUnavailable,
)

log = logging.getLogger(__name__)

KIND = ActionKind.VALIDATE
RULE = Rule.VALIDATE_BEFORE_RESUME
# Job states that are not a verdict yet
UNFINISHED = {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED"}
VERDICT_TAIL = 64 * 1024  # the verdict is the last JSON line of the job's output
# a validation still without a verdict this long before its reservation ends drains the node
MARGIN = timedelta(minutes=2)
AWAITING = "drained until its verdict"
# ... and one still without a verdict this long after the job's time limit past that end is a
# failed validation (Slurm's end of a job at its time limit: KillWait, epilog)
GRACE = timedelta(minutes=5)
DUE = "verdict due by"


def _late(a: Action, now: datetime) -> bool:
    """The reservation of a running validation is about to end. (Rows of older versions carry
    their creation time there: not a deadline.)"""
    due, made = a.next_attempt_at, a.created_at
    return due is not None and made is not None and due > made and now >= due


def cancel_validation_job(slurm: SlurmClient, job_id: int | None) -> str:
    """scancel babysitter's own validation job (its id as recorded on the validate action,
    never any other job); what was done."""
    if job_id is None:
        return ""
    try:
        AdmittedSlurm(slurm).cancel_job(job_id)  # babysitter's own job: no node changes hands
    except SlurmNotFound:
        return f"validation job {job_id} already gone"
    except SlurmError as exc:
        return f"validation job {job_id} not cancelled ({exc})"
    return f"validation job {job_id} cancelled"


def reservation_name(node: str) -> str:
    return f"babysitter_validate_{node}"


def read_verdict(path: Path) -> dict[str, Any] | None:
    """The last JSON object line of the job's output; bounded read, no link followed (the
    output directory is the controller's, but the job wrote the file)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        size = os.fstat(fd).st_size
        os.lseek(fd, max(0, size - VERDICT_TAIL), os.SEEK_SET)
        tail = os.read(fd, VERDICT_TAIL).decode("utf-8", "replace")
    finally:
        os.close(fd)
    # the last object line is the verdict: one that does not parse is no verdict (never an
    # earlier line's word instead)
    line = next((x for x in map(str.strip, reversed(tail.splitlines())) if x.startswith("{")), "")
    try:
        doc = json.loads(line) if line else None
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None


def verdict_failure(state: str, code: str, verdict: dict[str, Any] | None, job: int | None) -> str:
    """Why a finished validation job is not a pass ("": it passed). A pass is the job
    COMPLETED with exit 0 and a readable verdict line saying `"ok": true` and listing the
    devices it tested. No verdict, an unreadable one, one without `ok` or without devices is
    a failed validation, retried up to `validation.max_attempts` like any other."""
    doc = verdict or {}
    said = doc.get("failures")
    listed = "; ".join(str(f) for f in said[:3]) if isinstance(said, list) else ""
    if state != "COMPLETED" or not code.startswith("0:"):
        return listed or f"job {job} ended {state} exit {code or '?'}"
    if verdict is None:
        return f"job {job} exited 0 with no readable verdict"
    if doc.get("ok") is not True:
        return listed or f"job {job}: its verdict does not say ok"
    devices = doc.get("devices")
    if not isinstance(devices, list) or not devices:
        return f"job {job}: its verdict names no device tested"
    return ""


def tested_by(verdict: dict[str, Any] | None) -> str:
    """What the validation ran, for its action's outcome: the method and each DCGM test's
    status ("" for a verdict of an older `babysitter validate`, or none)."""
    if not verdict or not isinstance(verdict.get("validation"), str):
        return ""
    out = f"; {verdict['validation'][:100]}"
    dcgm = verdict.get("dcgm")
    if isinstance(dcgm, dict) and isinstance(dcgm.get("tests"), list):
        tests = [
            f"{t.get('name')} {t.get('status')}" for t in dcgm["tests"][:40] if isinstance(t, dict)
        ]
        out += f" [dcgmi diag -r {dcgm.get('level')}: {', '.join(tests) or 'no test result'}]"
    return out


class Validator:
    admission: Admission | None = None  # asked before a validation job (set by the engine)

    @property
    def admitted(self) -> AdmittedSlurm:
        """Its Slurm changes, each node change admitted first (controller/loop/admit/gate.py)."""
        return AdmittedSlurm(self.slurm, self.admission)

    def __init__(self, cfg: Config, store: Store, slurm: SlurmClient) -> None:
        self.cfg = cfg.validation
        self.enabled = cfg.validation.enabled(cfg.policy)
        self.store = store
        self.slurm = slurm

    def dcgm_level(self, node: str) -> int:
        """The `dcgmi diag` level for this validation: by the node's open remediation (its
        rung and fault), else a validation after a cleared fault."""
        row = next(iter(Ledger(self.store).history(node, limit=1)), None)
        if row is None or not row.open:
            return level_for(self.cfg, None, None)
        return level_for(self.cfg, row.rung.value, row.fault_class)

    def _argv(self, node: str) -> list[str]:
        c = self.cfg
        # the node's GPUs, from its Slurm gres: the job asks for all of them (under
        # ConstrainDevices a job that asks for none sees none) and `babysitter validate` must
        # test that many (SlurmError: unknown, the job is not started). No GPU gres is not
        # "no GPUs" (whole-node exclusive clusters configure none): the count is then unknown
        # and not passed, so validate goes by the hardware profile and NVML
        try:
            gpus = gres_gpus(self.slurm.node(node).gres)
        except ValueError as exc:
            raise SlurmError(f"{node}: {exc}") from None
        args = [
            "--job-name=babysitter-validate",
            f"--time={c.time_limit_min}",
            f"--output={c.output_dir / f'validate-{node}-%j.out'}",
            "--no-requeue",
            "--exclusive",
        ]
        if gpus:
            args.append(f"--gres=gpu:{gpus}")
        if c.partition:
            args.append(f"--partition={c.partition}")
        args += [a.replace("{node}", node) for a in c.sbatch_args]
        # unknown: unset, so no value inherited through sbatch's --export=ALL speaks for it
        count = [f"{GPUS_ENV}={gpus}"] if gpus else ["-u", GPUS_ENV]
        level = f"{LEVEL_ENV}={self.dcgm_level(node)}"
        command = ["env", *count, level, *(a.replace("{node}", node) for a in c.command)]
        return [*args, "--wrap", shlex.join(command)]

    def start(
        self, node: str, reason: str, now: datetime, reserved_until: datetime | None = None
    ) -> str | Refusal:
        """Start the validation job; what was done, or the admission step's refusal (held,
        not failed). `reserved_until`: when the node's reservation, made before (a
        reboot's), ends; else it is made now for the job's time limit + 5 min."""
        if self.admission and (held := self.admission.one(Act.VALIDATE, node, now)):
            return held  # not started: asked again when the policy / the healer asks next
        aid = self.store.record_action(
            KIND,
            node=node,
            reason=reason,
            rule=RULE,
            requested_by="policy",
            status=ActionStatus.RUNNING,
        )
        try:
            self.cfg.output_dir.mkdir(parents=True, exist_ok=True)
            # admitted again right before it goes (the gate): it resumes the node
            job = self.admitted.start_validation(
                node,
                reservation_name(node),
                self.cfg.user,
                self.cfg.time_limit_min + 5,
                self._argv(node),
                now,
            )
        except SlurmNodeSettling as exc:
            # not a verdict on the node: it stays drained (its resume was refused) and the
            # start is asked again. Not an unreachable slurmctld: the resume may have gone
            # through before the sbatch failed, and a node in service must not wait unvalidated
            # (that fails the rung, which drains it again)
            outcome = f"validation job not started yet: {exc}"
            self.store.update_action(aid, status="failed", done_at=now, outcome=outcome)
            audit.record_actions(self.store, [aid], now)
            log.warning("%s: %s", node, outcome)
            return Refusal(Why.UNKNOWN, outcome)
        except (SlurmError, OSError) as exc:
            outcome = f"could not start the validation job: {exc}"
            self.store.update_action(aid, status="failed", done_at=now, outcome=outcome)
            audit.record_actions(self.store, [aid], now)
            log.warning("%s: %s", node, outcome)
            return outcome
        outcome = f"validation job {job} running on {node} (reservation {reservation_name(node)})"
        ends = now + timedelta(minutes=self.cfg.time_limit_min + 5)
        ends = min(ends, reserved_until) if reserved_until else ends
        # when the node must be drained if the verdict is late (poll): never unvalidated out
        self.store.update_action(
            aid, job_id=job, attempts=1, outcome=outcome, next_attempt_at=ends - MARGIN
        )
        log.info("%s", outcome)
        return outcome

    def poll(
        self, now: datetime, firing: list[Alert], clearing: list[tuple[str | None, str]]
    ) -> None:
        """Turn finished validation jobs into resume-or-drain; called every tick."""
        running = [a for a in self.store.actions(status=ActionStatus.RUNNING) if a.kind is KIND]
        for a in running:
            job = a.job_id
            if job is None:
                continue
            if a.next_attempt_at is None and AWAITING in (a.outcome or ""):
                self._due_from(a, now)  # held by an older version, which set no deadline
                continue
            # held at its reservation's end already, and now past its verdict's deadline
            overdue = _late(a, now) and DUE in (a.outcome or "")
            if _late(a, now) and not overdue and not self._hold_until_verdict(a, now):
                return  # Slurm away: again next tick
            try:
                state, code = self.slurm.validation_outcome(job)
            except SlurmUnavailable:
                return  # ask again next tick
            except SlurmNotFound:
                state, code = "VANISHED", ""
            except SlurmError as exc:
                log.warning("validation job %s: %s", job, exc)
                continue
            if state in UNFINISHED:
                if overdue:  # a job pending on the drained node never starts: unknown, no pass
                    self._no_verdict(a, state, now, firing, clearing)
                continue
            self._finish(a, state, code, now, firing, clearing)

    def _due_from(self, a: Action, now: datetime) -> None:
        """A deadline for a validation drained for its verdict without one (rows of versions
        that waited for ever): the job's time limit + GRACE from now."""
        due = now + timedelta(minutes=self.cfg.time_limit_min) + GRACE
        outcome = f"{a.outcome}; {DUE} {due.isoformat(timespec='seconds')}"
        self.store.update_action(a.id, next_attempt_at=due, outcome=outcome)

    def _no_verdict(
        self,
        a: Action,
        state: str,
        now: datetime,
        firing: list[Alert],
        clearing: list[tuple[str | None, str]],
    ) -> None:
        """No verdict by its deadline: a failed validation (the job is cancelled, the node
        stays drained, the rung fails as on a failing verdict)."""
        due = a.next_attempt_at or now
        cancelled = cancel_validation_job(self.slurm, a.job_id)
        why = f"no verdict by {due.isoformat(timespec='seconds')} (job {a.job_id} {state}"
        self._finish(a, state, "", now, firing, clearing, why=f"{why}; {cancelled})")

    def _hold_until_verdict(self, a: Action, now: datetime) -> bool:
        """The reservation ends before the verdict came: drain the node (the job goes on;
        no other job may start there after the reservation), and keep waiting until the
        reservation's end + the job's time limit (one that started just before the drain may
        run all of it) + GRACE; then no verdict is a failed validation. False: Slurm is
        away."""
        assert a.node is not None and a.next_attempt_at is not None
        due = a.next_attempt_at + MARGIN + timedelta(minutes=self.cfg.time_limit_min) + GRACE
        reason = f"validation: no verdict before its reservation ends ({AWAITING})"
        try:
            self.admitted.drain(a.node, reason, now)
            done = AWAITING
        except SlurmUnavailable:
            return False
        except SlurmError as exc:  # someone else's reason: theirs, never overwritten
            done = f"not drained before its reservation ended: {exc}"
        log.warning("%s: validation job %s: %s", a.node, a.job_id, done)
        outcome = f"{a.outcome}; {done}; {DUE} {due.isoformat(timespec='seconds')}"
        self.store.update_action(a.id, next_attempt_at=due, outcome=outcome)
        if done == AWAITING:
            self.store.set_node(a.node, babysitter_drained=True, drain_reason=reason)
        return True

    def _passed(
        self,
        a: Action,
        node: str,
        verdict: dict[str, Any] | None,
        now: datetime,
        clearing: list[tuple[str | None, str]],
    ) -> None:
        back = ""
        if AWAITING in (a.outcome or ""):
            try:  # drained while it waited for this verdict: it returns now
                self.admitted.resume(node, now)
            except SlurmError as exc:
                back = f"; could not resume: {exc}"
        self.store.update_action(
            a.id,
            status="done",
            done_at=now,
            outcome=f"passed (job {a.job_id}){tested_by(verdict)}{back}"[:2000],
        )
        audit.record_actions(self.store, [a.id], now)
        self.store.set_node(node, babysitter_drained=False, drain_reason=None)
        clearing += [(node, "node_unhealthy"), (node, "validation_failed")]
        log.info("%s passed validation job %s: back in service", node, a.job_id)

    def _finish(
        self,
        a: Action,
        state: str,
        code: str,
        now: datetime,
        firing: list[Alert],
        clearing: list[tuple[str | None, str]],
        why: str = "",
    ) -> None:
        """`why`: the validation failed without a verdict (that is why)."""
        node, job = a.node, a.job_id
        assert node is not None
        verdict = read_verdict(self.cfg.output_dir / f"validate-{node}-{job}.out")
        why = why or verdict_failure(state, code, verdict, job)
        try:
            self.admitted.end_validation(reservation_name(node))
        except SlurmError as exc:
            log.warning("%s: could not delete the validation reservation: %s", node, exc)
        if not why:
            self._passed(a, node, verdict, now, clearing)
            return
        reason = f"validation failed: {why}"
        try:  # while its validation still runs: the node keeps its place in every cap
            self.admitted.drain(node, reason, now)
            drained = "drained again"
        except SlurmError as exc:
            drained = f"could not drain: {exc}"
        self.store.update_action(
            a.id, status="failed", done_at=now, outcome=f"{reason}{tested_by(verdict)}"[:2000]
        )
        self.store.set_node(node, babysitter_drained=True, drain_reason=reason, consecutive_clean=0)
        drain_id = self.store.record_action(
            ActionKind.DRAIN,
            node=node,
            reason=reason,
            rule=RULE,
            requested_by="validation",
            status=ActionStatus.DONE,
            outcome=drained,
        )
        audit.record_actions(self.store, [a.id, drain_id], now)
        firing.append(Alert(node, "validation_failed", Severity.CRITICAL, reason, drained, now))
        # this drain episode's failures, counted in the database (episodes.py)
        total = validation_history(self.store, [node]).get(node, NodeValidation()).failures
        if total >= self.cfg.max_attempts:
            firing.append(
                Alert(
                    node,
                    "validation_lemon",
                    Severity.CRITICAL,
                    f"{node} failed validation {total} times: lemon node, needs an admin",
                    "stays drained; no more automatic validation",
                    now,
                )
            )
