"""Issue 49, side door 4: a node returns only with a validation of *this* drain episode.

Every babysitter drain (the node policy's, a held drain carried out later, a switch incident's,
an NVLink domain incident's) starts a new validation history, kept in the database
(controller/db/episodes.py); a validation job passes only on a readable verdict that says ok and
lists the devices it tested. The real engine over the in-memory Slurm of the invariants, with a
clock the test moves."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from babysitter.config import parse_config
from babysitter.controller.api.ingest import ReportWriter
from babysitter.controller.db import models as m
from babysitter.controller.db.actions import Action, ActionKind, ActionStatus
from babysitter.controller.db.episodes import (
    NodeValidation,
    start_drain_episodes,
    validated_for_this_drain,
    validation_history,
)
from babysitter.controller.db.migrations import upgrade
from babysitter.controller.db.store import Store
from babysitter.controller.db.tickstore import record_actions
from babysitter.controller.loop.remediation import RemediationEngine, make_engine
from babysitter.finding import Finding
from babysitter.report import Report
from tests.fixtures.healing import PASSED_LINE, not_trained
from tests.fixtures.invariants import InvariantSlurm

VERDICT = json.loads(PASSED_LINE)


def disk(node: str) -> Finding:
    return Finding(
        check="host.disk",
        component="host",
        severity="critical",
        code="disk.readonly",
        message=f"/ on {node} is read-only",
        action="drain",
    )


def port_down() -> Finding:
    return Finding(
        check="infiniband",
        component="ib:mlx5_0/1",
        severity="critical",
        code="ib.port_down",
        message="ib:mlx5_0/1 is DOWN (physical Disabled)",
        action="drain",
    )


def untrained(domain: str) -> Finding:
    """An untrained NVLink fabric, naming the node's NVLink domain (as gpu.fabric does)."""
    return not_trained(2, details={"nvlink_domain": domain})


class Site:
    """Four nodes on one leaf switch, validation before every return."""

    def __init__(self, tmp_path: Path, **sections: dict[str, Any]) -> None:
        self.store = Store(f"sqlite:///{tmp_path / 'v.db'}")
        self.store.upgrade()
        self.names = ["n1", "n2", "n3", "n4"]
        self.slurm = InvariantSlurm(dict.fromkeys(self.names, "gpu"), {"leaf0": self.names})
        cfg: dict[str, Any] = {
            "policy": {
                "max_drained_fraction": 1.0,
                "max_drains_per_hour": 1000,
                "resume_after_clean_checks": 1,
                "validate_before_resume": True,
            },
            "controller": {"heartbeat_timeout_s": 10_000_000},
            "slurm": {"node_refresh_s": 0},
            "checks": {"sdc": {"enabled": False}},
            "remediation": {"enabled": False},
            "blast_radius": {
                "switch_fraction": 1.0,
                "partition_fraction": 1.0,
                "domain_fraction": 1.0,
            },
            "fabric": {"hold_s": 10},
            "validation": {"output_dir": str(tmp_path / "validation"), "max_attempts": 3},
        }
        for key, value in sections.items():
            cfg[key] = {**cfg.get(key, {}), **value}
        self.cfg = parse_config(cfg)
        self.now = datetime.now(UTC)
        self.report({n: () for n in self.names})
        self.engine: RemediationEngine = make_engine(self.cfg, self.store, slurm=self.slurm)

    def report(self, of: dict[str, tuple[Finding, ...]]) -> None:
        ReportWriter(self.store).write(
            [
                Report(node=n, report_id=str(uuid.uuid4()), sent_at=self.now, findings=list(f))
                for n, f in of.items()
            ]
        )

    def tick(self, n: int = 1) -> None:
        for _ in range(n):
            self.now += timedelta(seconds=20)
            self.engine.tick(self.now)

    def clean(self, *nodes: str) -> None:
        self.report({n: () for n in nodes})
        self.tick(2)

    def drained(self, node: str) -> bool:
        return self.slurm.node_state(node).drained_or_draining

    def reason(self, node: str) -> str:
        return self.slurm.node_state(node).reason

    def validations(self, node: str) -> list[Action]:
        """The node's validation jobs, oldest first."""
        rows = self.store.actions(limit=100_000)
        return [a for a in reversed(rows) if a.kind is ActionKind.VALIDATE and a.node == node]

    def running(self, node: str) -> bool:
        return any(a.status is ActionStatus.RUNNING for a in self.validations(node))

    def alerts(self) -> set[str]:
        return set(self.engine.router.firing_keys())

    def close(self) -> None:
        self.engine.close()
        self.store.close()


@pytest.fixture
def site(tmp_path: Path):
    s = Site(tmp_path)
    yield s
    s.close()


def _drained_validated_and_back(site: Site, node: str) -> None:
    """Episode 1: the node's own fault drains it, its validation passes, it returns."""
    site.tick()
    site.report({node: (disk(node),)})
    site.tick(2)
    assert site.drained(node)
    site.clean(node)
    assert site.running(node)
    site.slurm.verdict(node)
    site.tick(2)
    assert not site.drained(node)
    assert [a.status for a in site.validations(node)] == [ActionStatus.DONE]


# ---- (a) an incident's drain starts a new validation history


def test_a_switch_incidents_node_is_not_resumed_on_an_old_unrelated_validation(site: Site):
    """Before: a switch incident's drain (requested_by fabric) did not restart the history, so
    the node's validation passed weeks ago for a disk fault counted, and the node policy
    resumed it after the switch healed with no new validation."""
    _drained_validated_and_back(site, "n1")
    site.report({n: (port_down(),) for n in ("n1", "n2", "n3")})
    site.tick(4)
    assert site.drained("n1") and " switch " in site.reason("n1")
    site.clean(*site.names)  # the switch is healthy: the node policy takes its nodes over
    site.tick(2)
    assert site.drained("n1") or site.running("n1")
    assert len(site.validations("n1")) == 2  # a new validation for this episode
    site.slurm.verdict("n1")
    site.tick(2)
    assert not site.drained("n1")


def test_an_nvlink_domain_incidents_node_is_not_resumed_on_an_old_validation(site: Site):
    domain = "6f1c2a7e-0b3d-4c55-9a10-1d2e3f4a5b6c/1"
    _drained_validated_and_back(site, "n1")
    site.report({n: (untrained(domain),) for n in site.names})
    site.tick(4)
    assert site.drained("n1") and "domain" in site.reason("n1")
    site.clean(*site.names)
    site.tick(2)
    assert len(site.validations("n1")) == 2
    assert site.drained("n1") or site.running("n1")


# ---- (b) no verdict, an unreadable one, no ok, no devices: failed, retried up to the limit


def _no_devices() -> str:
    return json.dumps({**VERDICT, "devices": []})


def _without_ok() -> str:
    return json.dumps({k: v for k, v in VERDICT.items() if k != "ok"})


@pytest.mark.parametrize(
    ("line", "why"),
    [
        (None, "no readable verdict"),  # the job wrote no output file
        (f"{PASSED_LINE}\n{{not json", "no readable verdict"),  # its last line is cut off
        (_without_ok(), "does not say ok"),
        (_no_devices(), "names no device tested"),
        (json.dumps({k: v for k, v in VERDICT.items() if k != "devices"}), "no device"),
    ],
    ids=["no-file", "unreadable", "no-ok", "empty-devices", "no-devices-key"],
)
def test_a_validation_without_a_proper_verdict_fails_and_is_retried_up_to_the_limit(
    site: Site, line: str | None, why: str
):
    """Before: exit code 0 passed without a verdict file, without `ok` in it, and with no
    device recorded; an unreadable last line was skipped for an earlier one."""
    site.tick()
    site.report({"n1": (disk("n1"),)})
    site.tick(2)
    for attempt in range(1, 4):
        site.clean("n1")
        assert site.running("n1"), attempt
        site.slurm.verdict("n1", line=line)
        site.tick()
        last = site.validations("n1")[-1]
        assert last.status is ActionStatus.FAILED and why in (last.outcome or ""), last.outcome
        assert site.drained("n1") and "validation failed" in site.reason("n1")
        assert "n1|validation_failed" in site.alerts()
    assert "n1|validation_lemon" in site.alerts()
    site.clean("n1")
    site.tick(3)
    assert len(site.validations("n1")) == 3  # no fourth job: it waits for an admin
    assert site.drained("n1")


# ---- (c) the history is counted in the database, not read from the newest actions


def _bury(store: Store, n: int) -> None:
    """`n` newer actions of other nodes (a busy fleet's requeues)."""
    at = datetime.now(UTC)
    rows = [
        Action(ActionKind.REQUEUE, node=f"x{i % 97}", job_id=i, status=ActionStatus.DONE)
        for i in range(n)
    ]
    record_actions(store, rows, at)


def test_the_failure_count_survives_five_thousand_newer_actions(site: Site):
    """Before: the count came from the newest 5,000 actions: a lemon node's three failed
    validations fell out of it and a fourth job ran."""
    site.tick()
    site.report({"n1": (disk("n1"),)})
    site.tick(2)
    for _ in range(3):
        site.clean("n1")
        site.slurm.verdict("n1", "FAILED")
        site.tick()
    assert validation_history(site.store, ["n1"]) == {"n1": NodeValidation("failed", 3)}
    _bury(site.store, 5_001)
    site.clean("n1")
    site.tick(3)
    assert len(site.validations("n1")) == 3
    assert site.drained("n1")


def test_a_passed_validation_behind_five_thousand_actions_still_returns_the_node(site: Site):
    """The other side: a running validation behind a busy fleet is still seen as running (no
    second job), and its pass returns the node."""
    site.tick()
    site.report({"n1": (disk("n1"),)})
    site.tick(2)
    site.clean("n1")
    assert site.running("n1")
    _bury(site.store, 5_001)
    site.tick(3)
    assert len(site.validations("n1")) == 1
    site.slurm.verdict("n1")
    site.tick(2)
    assert not site.drained("n1")


# ---- the predicate and the history, as a table

POLICY, SWITCH, REDRAIN, ADMIN = "policy drain", "switch drain", "validation's drain", "admin"


def _apply(store: Store, events: list[str]) -> None:
    """Events of node n1 as the drain paths and the validator record them: a drain by
    babysitter starts an episode (executor settle, fabric_loop, nvlink_domain), the
    validation's own drain and an admin's do not."""
    by = {POLICY: "policy", SWITCH: "fabric", REDRAIN: "validation", ADMIN: "admin"}
    for e in events:
        if e in by:
            store.record_action(
                ActionKind.DRAIN, node="n1", requested_by=by[e], status=ActionStatus.DONE
            )
            if e in (POLICY, SWITCH):
                start_drain_episodes(store, ["n1"])
        else:
            store.record_action(ActionKind.VALIDATE, node="n1", status=ActionStatus(e))


@pytest.mark.parametrize(
    ("events", "history", "validated"),
    [
        ([], NodeValidation(), False),
        ([POLICY, "done"], NodeValidation("passed", 0), True),
        (["done", POLICY], NodeValidation(), False),
        ([POLICY, "done", SWITCH], NodeValidation(), False),  # an incident's drain
        ([POLICY, "failed", REDRAIN, "done"], NodeValidation("passed", 1), True),
        ([POLICY, "failed", REDRAIN, "running"], NodeValidation("running", 1), False),
        ([POLICY, "failed", REDRAIN, "failed", REDRAIN], NodeValidation("failed", 2), False),
        ([POLICY, "done", ADMIN], NodeValidation("passed", 0), True),  # the admin's, not ours
        ([POLICY, "skipped"], NodeValidation("failed", 0), False),  # taken over: no pass
    ],
)
def test_validated_for_this_drain(
    tmp_path: Path, events: list[str], history: NodeValidation, validated: bool
):
    store = Store(f"sqlite:///{tmp_path / 't.db'}")
    store.upgrade()
    ReportWriter(store).write(
        [Report(node="n1", report_id=str(uuid.uuid4()), sent_at=datetime.now(UTC), findings=[])]
    )
    _apply(store, events)
    got = validation_history(store).get("n1", NodeValidation())
    assert got == history
    assert validated_for_this_drain(got.state) is validated
    store.close()


def test_the_migration_starts_each_node_at_its_newest_babysitter_drain(tmp_path: Path):
    """A database of the previous version: each node's episode is its newest drain by the
    policy or an incident (not the validation's own, not an admin's)."""
    store = Store(f"sqlite:///{tmp_path / 'm.db'}")
    upgrade(store.engine, "0007_rma_archives")
    ReportWriter(store).write(
        [
            Report(node=n, report_id=str(uuid.uuid4()), sent_at=datetime.now(UTC), findings=[])
            for n in ("n1", "n2", "n3")
        ]
    )
    with store.engine.begin() as c:
        for node, by in [("n1", "policy"), ("n1", "validation"), ("n2", "fabric"), ("n3", "admin")]:
            c.execute(
                m.actions.insert().values(
                    kind="drain",
                    node=node,
                    requested_by=by,
                    status="done",
                    created_at=datetime.now(UTC),
                )
            )
    store.upgrade()
    episodes = {r["name"]: r["drain_episode"] for r in store.node_rows()}
    assert episodes == {"n1": 1, "n2": 3, "n3": None}
    store.close()
