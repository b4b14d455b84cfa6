"""The soak benchmark (bench/soak.py), tiny: a few simulated nodes for a few simulated hours.
A fleet under every kind of benign noise (at rates far above the defaults, so each kind shows
up) is not drained; a positive control (a real XID 79) is drained, counted, attributed to
its event and bounded; the bound is the rule of three with no drain, the Poisson bound with
some. `make bench` runs the full soak."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from bench import soak
from bench.common import REPO

BENIGN = """
[ecc_sbe]
per_node_day = 60.0
count = [1, 5]
[app_xid]
per_node_day = 60.0
xids = [13, 31, 43, 45]
[thermal]
per_node_day = 60.0
seconds = [30, 120]
[power]
per_node_day = 60.0
seconds = [10, 60]
[ib_symbol]
per_node_day = 60.0
count = [1, 3]
[nccl_user_timeout]
per_node_day = 30.0
[slurmd_restart]
per_node_day = 30.0
seconds = [2, 20]
[agent_restart]
per_node_day = 30.0
seconds = [1, 10]
[controller_failover]
per_fleet_day = 40.0
seconds = [10, 60]
"""
CONTROL = """
[positive_control_xid79]
per_node_day = 40.0
"""


def run_soak(
    tmp_path: Path, noise: str, nodes: int = 3, days: float = 0.1, extra: tuple[str, ...] = ()
) -> dict:
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / "noise.toml"
    path.write_text(noise)
    out = tmp_path / "results"
    args = ["--nodes", str(nodes), "--days", str(days), "--budget-s", "600", *extra]
    r = subprocess.run(
        [sys.executable, "-m", "bench.soak", *args, "--noise", str(path), "--results", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads((out / "soak.json").read_text())


def test_benign_noise_drains_nothing(tmp_path: Path):
    doc = run_soak(tmp_path, BENIGN)
    d = doc["details"]
    print(json.dumps({k: d[k] for k in ("node_hours", "injected", "decisions")}, indent=1))
    assert d["node_hours"] == pytest.approx(3 * 0.1 * 24, rel=0.01)  # the whole run simulated
    kinds = {k for k in soak.load_noise() if k != "ib_flap"}
    assert set(d["injected"]) == kinds  # every benign kind happened at least once
    assert d["false_drains"] == 0, d["drains"]
    assert d["upper_bound_per_node_day"] == pytest.approx(-math.log(0.05) / d["node_days"])
    # the noise was seen, not missed: job logs and XIDs reached the controller as alerts
    assert d["decisions"].get("alert:job_owned_finding", 0) >= 1
    assert doc["settings"]["nodes"] == 3 and doc["commit"]
    # what bounds node-days per wall second is reported: each part's seconds counted once
    parts = d["wall_parts_s"]
    assert {"controller tick", "agent checks", "ingest"} <= set(parts), parts
    assert sum(parts.values()) <= sum(x["wall_s"] for x in d["shards"]) + 0.5
    # alert volume, counted from the router's output: no page, job alerts on the job route only
    a = d["alerts"]
    assert a["pages"]["n"] == 0 and a["oncall_warnings"]["n"] == 0, a["fired_by_condition"]
    assert a["pages"]["ci95"][0] == 0 < a["pages"]["ci95"][1]
    assert a["job_alerts"]["n"] >= d["injected"]["nccl_user_timeout"] * 0.5  # a user's NCCL
    assert a["job_alerts"]["n"] == sum(x["fired"] for x in a["by_route"]["job"].values())
    assert set(a["by_sink"]["slack_jobs"]) == {"job"}  # the job channel: job alerts only
    assert "job" not in a["by_sink"].get("pagerduty", {}) and "job" not in a["by_sink"].get(
        "slack", {}
    )
    assert all(k.startswith("job|") for k in a["fired_by_condition"]), a["fired_by_condition"]
    assert set(a["nhc_drains"]) == {"60", "300"}
    # what stays open at the end: an application XID's NVML event is not kept until a reboot
    assert "xid.nvml" not in d["open_findings_at_end"], d["open_findings_at_end_by_code"]
    assert 0 <= d["nodes_open_at_end"] <= 3
    assert sum(d["open_findings_at_end_by_code"].values()) == sum(
        d["open_findings_at_end"].values()
    )
    md = (tmp_path / "results" / "soak.md").read_text()
    assert "| pages (critical, PagerDuty) | oncall | 0: 0 [0, " in md
    assert f"Open at the end: {d['nodes_open_at_end']} of 3 nodes" in md


def test_a_real_fault_is_counted_attributed_and_bounded(tmp_path: Path):
    doc = run_soak(tmp_path, CONTROL)
    d = doc["details"]
    assert d["false_drains"] >= 1
    for drain in d["drains"]:
        assert drain["rule"] == "critical_finding"
        assert "xid.kmsg: XID 79" in drain["reason"]
        assert any(e.startswith("positive_control_xid79") for e in drain["recent_events"])
    # a real fault still pages on-call: one page per node it took out (none grouped here)
    a = d["alerts"]
    assert a["pages"]["n"] >= 1 and a["pages"]["per_1000_node_days"] > 0
    assert a["fired_by_condition"].get("oncall|critical|node_unhealthy", 0) >= 1
    assert a["by_route"]["oncall"]["critical"]["fired"] == a["pages"]["n"]
    assert a["job_alerts"]["n"] == 0
    k = d["false_drains"]
    assert d["upper_bound_per_node_day"] == pytest.approx(soak.poisson_upper(k, d["node_days"]))
    assert d["upper_bound_per_node_day"] > k / d["node_days"]


def test_poisson_upper_bound_matches_known_values():
    """One-sided 95 % upper limits for 0, 1, 2 events: 2.996, 4.744, 6.296 (per unit)."""
    assert soak.poisson_upper(0, 1.0) == pytest.approx(2.996, abs=1e-3)
    assert soak.poisson_upper(1, 1.0) == pytest.approx(4.744, abs=1e-3)
    assert soak.poisson_upper(2, 10.0) == pytest.approx(0.6296, abs=1e-4)


def test_two_sided_interval_is_garwoods():
    """Exact two-sided 95 % Poisson limits (Garwood): 0 events [0, 3.689], 1 [0.0253, 5.572],
    18 [10.668, 28.448] (per unit exposure)."""
    assert soak.poisson_interval(0, 1.0) == pytest.approx((0.0, 3.689), abs=1e-3)
    assert soak.poisson_interval(1, 1.0) == pytest.approx((0.0253, 5.572), abs=1e-3)
    assert soak.poisson_interval(18, 2.0) == pytest.approx((5.334, 14.224), abs=1e-3)


USER_TIMEOUTS = """
[nccl_user_timeout]
per_node_day = 20.0
seconds = [5, 120]
[agent_restart]
per_node_day = 20.0
seconds = [1, 10]
"""


def test_a_job_the_nccl_watchdog_aborted_stops_being_the_nodes_evidence_once_it_ended(
    tmp_path: Path,
):
    """The aborted job ends (its ranks exit) and its log is read for the NCCL check's grace
    only; a restarted agent's checks run again after their first read, as the real agent's do.
    Simulated as running for ever and read once after an agent restart, old jobs' watchdog
    lines were found again and stayed open critical findings to the end (re-alerted every
    tick), so week-old fleets piled them up."""
    doc = run_soak(tmp_path, USER_TIMEOUTS, nodes=2, days=0.3)
    d = doc["details"]
    injected = d["injected"]["nccl_user_timeout"]
    assert injected >= 6
    assert d["injected"]["agent_restart"] >= 6
    assert d["decisions"]["alert:job_owned_finding"] >= injected  # each was seen
    # only a job that ended in the run's last ~12 minutes may still be read
    assert d["open_findings_at_end"].get("nccl.logs", 0) <= 1, d["open_findings_at_end"]
    assert d["false_drains"] == 0 and d["false_interruptions"] == 0


FLAPS = """
[ib_flap]
per_node_day = 20.0
seconds = [2, 25]
"""
LONG_DOWN = """
[ib_flap]
per_node_day = 30.0
seconds = [90, 120]
"""


def test_survivable_ib_flaps_drain_nothing_and_interrupt_no_job(tmp_path: Path):
    """A flap within NCCL's retry budget (the IB check's hold window, 30 s at defaults): a
    warning while it lasts, no drain, and the babysat job on the node is never touched. NHC
    drains the same flaps."""
    d = run_soak(tmp_path, FLAPS)["details"]
    assert d["injected"]["ib_flap"] >= 1
    assert d["false_drains"] == 0, d["drains"]
    assert d["false_interruptions"] == 0, d["interruptions"]
    assert d["interruptions_upper_bound_per_node_day"] == pytest.approx(
        -math.log(0.05) / d["node_days"]
    )
    lo, hi = d["false_drains_ci95_per_node_day"]
    assert lo == 0 < hi
    # NHC's arm met the same flaps: each run that saw a port down drained, the next resumed
    assert set(d["nhc"]) == {"60", "300"}
    for x in d["nhc"].values():
        assert x["runs_evaluated"] >= d["injected"]["ib_flap"]  # at least the run after each
        assert all(r["reason"].startswith("NHC: check_hw_ib:  No IB port") for r in x["drains"])
        assert x["drains_open_at_end"] <= x["false_drains"]


def test_a_port_down_past_the_grace_interrupts_the_job_and_is_counted(tmp_path: Path):
    """Positive control: a port down for minutes is a fault the job dies of; its requeue is
    counted as an interruption, with its reason."""
    d = run_soak(tmp_path, LONG_DOWN)["details"]
    assert d["false_drains"] >= 1 and d["drained_node_hours"] > 0
    assert all("ib.ports" in x["reason"] for x in d["drains"])
    assert d["decisions"].get("resume:fault_cleared", 0) >= 1
    # every drain has a length: the resumed ones theirs, the open ones their length so far
    assert d["drains_resumed"] + d["drains_open_at_end"] == d["false_drains"]
    assert 0 < d["drain_minutes_p50"] <= d["drain_minutes_p99"] <= d["drain_minutes_max"]
    lo, hi = d["false_drains_ci95_per_node_day"]
    assert lo < d["false_drains_per_node_day"] < hi
    assert d["false_interruptions"] >= 1
    assert all("ib.ports" in i["reason"] for i in d["interruptions"])
    assert d["interruptions_upper_bound_per_node_day"] > d["false_interruptions_per_node_day"]


MANY_FLAPS = """
[ib_flap]
per_node_day = 150.0
seconds = [2, 25]
"""


def test_nhc_runs_skipped_while_no_port_is_down_change_nothing(tmp_path: Path):
    """The soak evaluates NHC only on the runs that can fail (while a port is down) and the one
    after; with every run of every node evaluated instead, on the same seed and noise, NHC's
    drains, their times, reasons and lengths are the same, and babysitter's decisions too."""
    docs = [
        run_soak(tmp_path / "skip", MANY_FLAPS),
        run_soak(tmp_path / "every", MANY_FLAPS, extra=("--nhc-every-run",)),
    ]
    skip, every = (d["details"] for d in docs)
    t0 = [d["settings"]["t0"] for d in docs]  # each run starts at its own wall-clock second
    assert skip["injected"] == every["injected"] and skip["injected"]["ib_flap"] >= 20
    assert skip["node_days"] == every["node_days"]
    # babysitter's side did not notice NHC's extra runs
    assert skip["decisions"] == every["decisions"] and skip["false_drains"] == every["false_drains"]
    for iv in ("60", "300"):
        a, b = skip["nhc"][iv], every["nhc"][iv]
        assert b["runs_evaluated"] > a["runs_evaluated"]  # the shortcut skipped runs
        drains = [
            [(d["t"] - t, d["node"], d["reason"]) for d in x["drains"]]
            for x, t in ((a, t0[0]), (b, t0[1]))
        ]
        assert drains[0] == drains[1], iv
        for k in ("false_drains", "drain_minutes_p50", "drain_minutes_max", "drains_open_at_end"):
            assert a[k] == pytest.approx(b[k]), (iv, k)
    assert skip["nhc"]["60"]["false_drains"] >= 1  # the comparison saw drains


# Every kind of benign noise at rates that keep some nodes busy and leave others quiet long
# enough to fold, flaps long enough to drain and requeue jobs, agents restarted past the
# heartbeat timeout and controller failovers: what the shortcuts must not change.
EQUIVALENCE = """
[ecc_sbe]
per_node_day = 20.0
count = [1, 5]
[app_xid]
per_node_day = 10.0
xids = [13, 31, 43, 45]
[thermal]
per_node_day = 20.0
seconds = [30, 120]
[power]
per_node_day = 20.0
seconds = [10, 60]
[ib_symbol]
per_node_day = 20.0
count = [1, 3]
[ib_flap]
per_node_day = 6.0
seconds = [2, 150]
[nccl_user_timeout]
per_node_day = 5.0
seconds = [5, 120]
[slurmd_restart]
per_node_day = 5.0
seconds = [2, 20]
[agent_restart]
per_node_day = 5.0
seconds = [1, 200]
[controller_failover]
per_fleet_day = 20.0
seconds = [10, 60]
"""


def _decisions(doc: dict, log_dir: Path) -> list[list]:
    rows = []
    for p in sorted(log_dir.glob("shard-*.jsonl")):
        rows += [json.loads(line) for line in p.read_text().splitlines()]
    assert doc["details"]["decisions"]  # the log is the run's: as many as it counted
    assert len(rows) == sum(doc["details"]["decisions"].values())
    return rows


def _outcomes(d: dict) -> dict:
    """What the soak reports, less the shortcuts' own counters and the wall times."""
    keep = (
        "nodes",
        "node_days",
        "injected",
        "decisions",
        "drains",
        "interruptions",
        "drained_node_hours",
        "drain_minutes_p50",
        "drain_minutes_p99",
        "drain_minutes_max",
        "drains_resumed",
        "drains_open_at_end",
        "nhc",
        "ticks",
        "ticks_skipped",
        "check_runs",
        "reports",
    )
    return {k: d[k] for k in keep}


def test_folding_quiet_reports_and_repeated_job_scans_changes_no_decision(tmp_path: Path):
    """The quiet-node shortcut (a quiet node's repeated report folded into its node row, not
    ingested) and the skipped repeat job scans are shown equivalent: the same seed run with
    and without them makes every decision at the same virtual time, about the same node, of
    the same kind, rule and reason, and the same drains (times, reasons, lengths), job
    interruptions, NHC results and injected noise. Two shards (distinct seeds) each way."""
    args = ("--shard-nodes", "5", "--workers", "2")
    runs = {}
    for mode, extra in (("fold", ()), ("every", ("--no-fold",))):
        log = tmp_path / mode / "decisions"
        doc = run_soak(
            tmp_path / mode,
            EQUIVALENCE,
            nodes=10,
            days=0.25,
            extra=(*args, "--decision-log", str(log), *extra),
        )
        runs[mode] = (doc, _decisions(doc, log))
    (fold, fold_log), (every, every_log) = runs["fold"], runs["every"]
    f, e = fold["details"], every["details"]
    # the shortcuts did their work (else the comparison shows nothing)
    assert f["reports_folded"] > f["reports_ingested"] / 4, f["reports_folded"]
    assert f["job_scans_skipped"] > 0 and e["reports_folded"] == e["job_scans_skipped"] == 0
    assert f["reports_ingested"] + f["reports_folded"] == f["reports"] == e["reports"]
    # and what they must not change
    assert fold_log == every_log
    assert _outcomes(f) == _outcomes(e)
    # the comparison saw the decisions that matter
    assert f["false_drains"] >= 1 and f["drains_resumed"] >= 1 and f["false_interruptions"] >= 1
    assert f["decisions"].get("alert:heartbeat_missing", 0) >= 1
    assert f["injected"].get("controller_failover", 0) >= 1
    assert f["injected"].get("agent_restart", 0) >= 1
    # two independent shards: their own seeds, node names and counts summed
    shards = f["shards"]
    assert [s["nodes"] for s in shards] == [5, 5]
    assert len({s["seed"] for s in shards}) == 2
    assert {s["first_node"] for s in shards} == {"gpu0000", "gpu0005"}
    assert f["node_days"] == pytest.approx(10 * 0.25, rel=0.01)


def test_shard_seeds_are_distinct_and_the_nodes_are_split():
    specs = soak.shard_specs(100, 32, 7, 30.0, 0.0, 0.0)
    assert [s.nodes for s in specs] == [32, 32, 32, 4]
    assert [s.first for s in specs] == [0, 32, 64, 96]
    assert len({s.seed for s in specs}) == 4
    assert specs == soak.shard_specs(100, 32, 7, 30.0, 0.0, 0.0)  # the same seed, the same
    assert {s.seed for s in specs}.isdisjoint(s.seed for s in soak.shard_specs(100, 32, 8, 1, 0, 0))


# a fleet of its own in a fresh process (the fake libnvidia-ml is preloaded before pynvml's
# first use), started far from the wall clock: its findings' observed_at, as the store holds
# them, and the virtual span they must lie in
STAMPS = """
import json, sys
from pathlib import Path
from sqlalchemy import select
from bench import soak
from babysitter.controller.db import models as m
from babysitter.controller.db.store import aware
soak.preload(soak.build())
t0 = 1_000_000_000.0
work = Path(sys.argv[1])
work.mkdir()
sim = soak.Soak(2, 7, work, {"positive_control_xid79": {"per_node_day": 40.0}}, t0=t0)
run = sim.run(0.05, 300.0)
f = m.findings.c
with sim.store.engine.connect() as c:
    rows = c.execute(select(f.code, f.observed_at)).all()
print(json.dumps({"t0": t0, "end": t0 + run["simulated_s"],
                  "stamps": [[code, aware(at).timestamp()] for code, at in rows]}))
"""


def test_findings_are_stamped_on_the_virtual_clock(tmp_path: Path):
    """Every finding the agents send carries an observed_at of the simulation, not of the wall
    clock: the controller's XID window (24 h back from the virtual now) counts findings by it.
    On the wall clock, a run past 24 simulated hours counted an XID 79 a varying number of
    times, by how fast the run had gone (two runs of one seed decided differently)."""
    r = subprocess.run(
        [sys.executable, "-c", STAMPS, str(tmp_path / "work")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    d = json.loads(r.stdout.splitlines()[-1])
    stamps = d["stamps"]
    assert any(code == "xid.79" for code, _ in stamps), stamps  # the faults were seen
    outside = [(code, at) for code, at in stamps if not d["t0"] <= at <= d["end"]]
    assert not outside, (d["t0"], d["end"], outside[:5])
