"""The ETTR simulator (bench/ettr.py): it reproduces its reference run's interruption count from
its inputs, arms with equal parameters get equal ETTR, a seed makes it repeatable, and the time
accounting closes. Small replica counts keep this fast; `make bench` runs the full sweep."""

from __future__ import annotations

import dataclasses
import json
import math
import re
from pathlib import Path

import numpy as np
import pytest

from bench import ettr

REPLICAS = 30
SEED = 7


@pytest.fixture(scope="module")
def inputs():
    return ettr.load_inputs()


@pytest.fixture(scope="module")
def model(inputs):
    return ettr.build_model(inputs)


@pytest.fixture(scope="module")
def arms(inputs):
    arms, _ = ettr.build_arms(inputs)
    return {a.name: a for a in arms}


def test_every_input_number_names_its_source():
    """Each number in the data file sits in a paragraph (lines between blank lines) that names
    a source tag ([L3], [PT], ...), or says it is an assumption or a fallback."""
    tags = re.compile(r"\[(L3|PT|SL|YD|BS)\]|assumption|fallback")
    unsourced = []
    for para in re.split(r"\n\s*\n", ettr.INPUTS.read_text()):
        numeric = [
            ln
            for ln in para.splitlines()
            if "=" in ln.split("#", 1)[0] and re.search(r"=\s*[\[{]?\s*[\d.]", ln)
        ]
        if numeric and not tags.search(para):
            unsourced += numeric
    assert not unsourced, unsourced


def test_llama3_setting_reproduces_its_interruption_count(model, arms):
    """16,384 GPUs for 54 days at the per-GPU rates taken from Llama 3's Table 5: 419 ± 10 %
    unexpected interruptions (and the 47 planned ones)."""
    assert (model.gpus, model.days) == (16384, 54)
    runs = [
        ettr.simulate(model, arms["babysitter"], ettr.draw_replica(model, SEED, r), 1800)
        for r in range(REPLICAS)
    ]
    unexpected = np.mean([r.unexpected for r in runs])
    planned = np.mean([r.planned for r in runs])
    print(f"\nunexpected {unexpected:.1f} (419), planned {planned:.1f} (47)")
    assert abs(unexpected - 419) <= 41.9
    assert abs(planned - 47) <= 4.7 * 2  # 47 is a small count: Poisson spread ~ 7 per run


def test_half_the_gpus_see_half_the_failures(inputs):
    half = ettr.build_model(inputs, gpus=8192)
    n = np.mean([len(ettr.draw_replica(half, SEED, r).times) for r in range(REPLICAS)])
    assert abs(n - 419 / 2) <= 419 / 2 * 0.1


def test_equal_latencies_give_equal_ettr(model, arms):
    """An NHC arm given babysitter's parameters gets babysitter's ETTR: on the same failures
    (common random numbers) exactly, and on independent failures within the 95 % CIs."""
    bs = arms["babysitter"]
    twin = dataclasses.replace(bs, name="NHC with babysitter's latencies")
    res = ettr.run_arms(model, [bs, twin], [1800.0], REPLICAS, SEED)
    a, b = res["arms"][bs.name][0], res["arms"][twin.name][0]
    assert a["ettr_samples"] == b["ettr_samples"]
    other = ettr.run_arms(model, [twin], [1800.0], REPLICAS, SEED + 1)["arms"][twin.name][0]
    print(f"\n{a['ettr']:.4f} ± {a['ci95']:.4f} vs {other['ettr']:.4f} ± {other['ci95']:.4f}")
    assert abs(a["ettr"] - other["ettr"]) <= math.hypot(a["ci95"], other["ci95"])


def test_arms_differ_where_their_parameters_do(model, arms):
    """With few false interruptions (1e-4 per node-day, not whatever soak.json holds today) the
    arm that sees more and acts sooner keeps more of the run."""
    names = ["babysitter", "NHC every 300 s", "no health tool", ettr.IDEAL]
    chosen = {n: arms[n] for n in names}
    chosen["babysitter"] = dataclasses.replace(
        arms["babysitter"], false_interruptions_per_node_day=1e-4, false_drains_per_node_day=0.0
    )
    res = ettr.run_arms(model, list(chosen.values()), [1800.0], REPLICAS, SEED)
    e = {n: res["arms"][n][0]["ettr"] for n in names}
    print("\n" + ", ".join(f"{n}: {v:.4f}" for n, v in e.items()))
    assert e[ettr.IDEAL] > e["babysitter"] > e["NHC every 300 s"] > e["no health tool"]


def test_seeded_runs_repeat(model, arms):
    arm = [arms["NHC every 60 s"]]
    one = ettr.run_arms(model, arm, [900.0], 5, SEED)
    two = ettr.run_arms(model, arm, [900.0], 5, SEED)
    three = ettr.run_arms(model, arm, [900.0], 5, SEED + 1)
    assert one == two
    assert one != three


def test_time_accounting_closes(model, arms):
    """Kept training time + every lost category = wall time, in every arm."""
    d = ettr.draw_replica(model, SEED, 0)
    for arm in arms.values():
        for iv in (300.0, 3600.0):
            r = ettr.simulate(model, arm, d, iv)
            total = r.ettr * model.horizon_s + sum(r.lost_s.values())
            assert total == pytest.approx(model.horizon_s, rel=1e-9), arm.name


def test_missing_measurements_fall_back_and_say_so(inputs, tmp_path: Path):
    arms, notes = ettr.build_arms(inputs, results_dir=tmp_path)
    assert any("NOT MEASURED" in n and "xid79" in n for n in notes)
    assert any("false interruptions and false drains: NOT MEASURED" in n for n in notes)
    bs = next(a for a in arms if a.name == "babysitter")
    assert bs.latency["xid_drained"].samples == (inputs["babysitter"]["fallback_drain_s"],)
    fallback = inputs["babysitter"]
    assert bs.false_drains_per_node_day == fallback["fallback_false_drains_per_node_day"]
    assert (
        bs.false_interruptions_per_node_day == fallback["fallback_false_interruptions_per_node_day"]
    )
    assert bs.false_drain_s == fallback["fallback_false_drain_h"] * 3600


def _write_soak(tmp_path: Path, interruptions: bool = True) -> None:
    """A soak.json: 2 false drains and 0 false interruptions in 150 node-days, with one-sided
    bounds (0.0234, 0.0123) that are not what a point estimate would be."""
    details = {"false_drains": 2, "false_interruptions": 0, "node_days": 150.0}
    details |= {"node_hours": 3600.0, "drain_hours_mean": 0.1}
    figs = [{"metric": ettr.SOAK_BOUND, "value": 0.0234}]
    if interruptions:
        figs.append({"metric": ettr.SOAK_INTERRUPTIONS, "value": 0.0123})
    (tmp_path / "soak.json").write_text(json.dumps({"figures": figs, "details": details}))


def test_false_rates_are_the_soaks_point_estimates_with_intervals(inputs, tmp_path: Path):
    """babysitter is charged the soak's point estimates (count / node-days) with their two-sided
    95 % intervals (Garwood), not its one-sided upper bounds; false drains last the soak's mean
    drain; the notes say so; the NHC arms' false drains are 'NOT MEASURED', assumed 0."""
    _write_soak(tmp_path)
    arms, notes = ettr.build_arms(inputs, results_dir=tmp_path)
    bs = next(a for a in arms if a.name == "babysitter")
    assert bs.false_interruptions_per_node_day == 0.0
    assert bs.false_drains_per_node_day == pytest.approx(2 / 150)
    assert bs.false_interruptions_ci95 == pytest.approx((0.0, 3.689 / 150), rel=1e-3)
    assert bs.false_drains_ci95 == pytest.approx((0.2422 / 150, 7.225 / 150), rel=1e-3)
    assert bs.false_drain_s == pytest.approx(360.0)
    assert any(
        "false interruptions" in n and "point estimate" in n and "150.0 node-days" in n
        for n in notes
    )
    assert any(n.startswith("NHC false drains: NOT MEASURED") for n in notes)
    assert any("check_hw_ib" in n and "lacks" in n for n in notes)
    for a in arms:
        if a.name.startswith("NHC"):
            assert a.false_drains_per_node_day == a.false_interruptions_per_node_day == 0
            assert a.false_drains_ci95 is None
    # the what-if: charged the one-sided bounds, without an interval
    upper = {**inputs, "babysitter": {**inputs["babysitter"], "charge": "upper"}}
    bs = next(a for a in ettr.build_arms(upper, results_dir=tmp_path)[0] if a.name == "babysitter")
    assert (bs.false_interruptions_per_node_day, bs.false_drains_per_node_day) == (0.0123, 0.0234)
    assert bs.false_interruptions_ci95 is None
    # an older soak that counted drains only: each drain may have been an interruption
    _write_soak(tmp_path, interruptions=False)
    arms, notes = ettr.build_arms(inputs, results_dir=tmp_path)
    bs = next(a for a in arms if a.name == "babysitter")
    assert bs.false_interruptions_per_node_day == pytest.approx(2 / 150)
    assert any("older soak" in n for n in notes)


def test_nhc_false_drains_come_from_the_soaks_nhc_arms(inputs, tmp_path: Path):
    """Where the soak ran NHC's arms on the same noise, each NHC arm is charged its own point
    estimate, interval and mean drain length, as babysitter is."""
    _write_soak(tmp_path)
    doc = json.loads((tmp_path / "soak.json").read_text())
    doc["details"]["nhc"] = {
        "60": {"false_drains": 3, "drain_hours_mean": 0.02},
        "300": {"false_drains": 1, "drain_hours_mean": 0.1},
    }
    (tmp_path / "soak.json").write_text(json.dumps(doc))
    arms, notes = ettr.build_arms(inputs, results_dir=tmp_path)
    by = {a.name: a for a in arms}
    assert by["NHC every 60 s"].false_drains_per_node_day == pytest.approx(3 / 150)
    assert by["NHC every 300 s"].false_drains_per_node_day == pytest.approx(1 / 150)
    assert by["NHC every 300 s"].false_drains_ci95 == pytest.approx(
        (0.0253 / 150, 5.572 / 150), rel=1e-3
    )
    assert by["NHC every 300 s"].false_drain_s == pytest.approx(360.0)
    assert not any("NOT MEASURED" in n and n.startswith("NHC") for n in notes)
    assert any(n.startswith("NHC every 300 s false drains: 0.00667") for n in notes)


def test_swapping_the_labels_of_identical_arms_changes_nothing(model, arms):
    """Symmetry: the model charges an arm by its inputs, never by its name. Two arms with the
    same inputs get the same ETTR whichever label each wears, and so do their rate ranges."""
    nhc = dataclasses.replace(
        arms["NHC every 300 s"], false_drains_per_node_day=1e-3, false_drain_s=600.0
    )
    bs = dataclasses.replace(
        arms["babysitter"],
        false_interruptions_per_node_day=1e-4,
        false_drains_per_node_day=1e-3,
        false_drain_s=600.0,
        false_interruptions_ci95=(0.0, 1e-3),
        false_drains_ci95=(5e-4, 2e-3),
    )
    twin = dataclasses.replace(bs, name=nhc.name)  # babysitter's inputs under NHC's label
    one = ettr.run_arms(model, [bs, nhc], [1800.0], 10, SEED)["arms"]
    two = ettr.run_arms(model, [twin, dataclasses.replace(nhc, name=bs.name)], [1800.0], 10, SEED)[
        "arms"
    ]
    assert one[bs.name][0]["ettr_samples"] == two[nhc.name][0]["ettr_samples"]
    assert one[nhc.name][0]["ettr_samples"] == two[bs.name][0]["ettr_samples"]
    r1 = ettr.rate_intervals(model, [bs], 1800.0, 5, SEED)[bs.name]
    r2 = ettr.rate_intervals(model, [twin], 1800.0, 5, SEED)[nhc.name]
    assert r1 == r2 and r1[0] <= r1[1]


def test_an_upper_bound_never_appears_in_the_headline(inputs, model, tmp_path: Path):
    """The headline tables charge point estimates: the soak's one-sided bounds (0.0123, 0.0234
    here) appear in no headline row, only as a what-if; the NHC arms' unmeasured false drains
    read 'not measured', never 0.0."""
    _write_soak(tmp_path)
    arms, notes = ettr.build_arms(inputs, results_dir=tmp_path)
    res = ettr.run_arms(model, arms, [1800.0], 4, SEED)
    ranges = ettr.rate_intervals(model, arms, 1800.0, 4, SEED)
    md = ettr.render_md(res, model, notes, 30.0)
    md += ettr.render_charges(res, arms, ranges, model, 30.0, nhc_drains_measured=False)
    rows = [ln for ln in md.splitlines() if ln.startswith("| ")]
    assert not [r for r in rows if "0.0123" in r or "0.0234" in r], rows
    nhc_rows = [r for r in rows if r.startswith("| NHC every") and "not measured" in r]
    assert len(nhc_rows) == 2
    assert any(label.startswith(ettr.UPPER) for label, _ in ettr.VARIANTS)


def test_false_drains_take_nodes_from_the_spare_pool(model, arms):
    """A false drain leaves the job running: with spares to spare the same ETTR as none,
    node-hours out; with more nodes drained at once than spares, restarts wait for nodes and
    the job loses time. A false interruption restarts the job: less ETTR."""
    roomy = dataclasses.replace(model, spare_nodes=10**6)
    none = dataclasses.replace(
        arms["babysitter"],
        false_interruptions_per_node_day=0.0,
        false_drains_per_node_day=0.0,
        false_drain_s=36000.0,
    )
    drains = dataclasses.replace(none, name="drains", false_drains_per_node_day=1e-2)
    stops = dataclasses.replace(none, name="stops", false_interruptions_per_node_day=1e-2)
    res = ettr.run_arms(roomy, [none, drains, stops], [1800.0], 10, SEED)["arms"]
    a, b, c = res[none.name][0], res["drains"][0], res["stops"][0]
    assert a["ettr_samples"] == b["ettr_samples"]
    assert b["false_drains_mean"] > 0 and b["false_drain_node_hours"] > 0
    assert a["false_drain_node_hours"] == 0
    assert c["ettr"] < a["ettr"] and c["wrong_drains_mean"] > 0
    # 1e-2 per node-day x 2,048 nodes x 10 h: ~8.5 nodes out at once, more than 4 spares
    tight = dataclasses.replace(model, spare_nodes=4)
    res = ettr.run_arms(tight, [none, drains], [1800.0], 10, SEED)["arms"]
    assert res["drains"][0]["ettr"] < res[none.name][0]["ettr"]


def test_xid_coverage_comes_from_the_products_catalog(inputs):
    """NVLink XID 74 and the NVLink5 XIDs follow NVIDIA's catalog (reset the GPU) and XID 154
    the driver's recovery action: all drained, as are 79 (off the bus) and the GSP XIDs; 13
    (an application's fault) is not. A site override moves the credit back."""
    assert ettr.xid_drained(74) and ettr.xid_drained(145) and ettr.xid_drained(154)
    assert not ettr.xid_drained(13)
    assert ettr.xid_drained(79) and ettr.xid_drained(119) and ettr.xid_drained(48)
    assert not ettr.xid_drained(74, {74: "inspect"})
    r = ettr.resolve_xids(inputs)
    gpu = next(c for c in r["cause"] if c["name"] == "Faulty GPU (incl. NVLink)")
    # every XID of its 90 % XID share is drained now (74 30 %, 145 5 %, 154 10 % were alerts)
    assert gpu["classes"].get("xid_alerted", 0.0) == pytest.approx(0.0)
    assert gpu["classes"]["xid_drained"] == pytest.approx(0.9)
    assert r["class"]["xid_drained"]["babysitter_sees"] == 1.0
    assert r["class"]["xid_alerted"]["babysitter_sees"] == 0.0
    inputs2 = {
        **inputs,
        "babysitter": {**inputs["babysitter"], "xid_overrides": {"74": "inspect"}},
    }
    gpu2 = next(c for c in ettr.resolve_xids(inputs2)["cause"] if c["name"] == gpu["name"])
    assert gpu2["classes"]["xid_drained"] == pytest.approx(0.9 * 0.70)


def test_what_ifs_cover_false_interruption_rates_and_xid_coverage(inputs, model):
    labels = [label for label, _ in ettr.VARIANTS]
    for r in ("0.0001", "0.001", "0.01"):
        assert f"babysitter false interruptions {r} per node-day" in labels
    assert sum(label.startswith("XID coverage") for label in labels) == 2
    # the rate moves babysitter's ETTR: 1e-2 per node-day on 2,048 nodes is ~1,100 restarts a run
    ettrs = []
    for rate in (1e-4, 1e-2):
        bs_in = {**inputs["babysitter"], "false_interruptions_per_node_day": rate}
        v = {**inputs, "babysitter": bs_in}
        arms, _ = ettr.build_arms(v)
        bs = next(a for a in arms if a.name == "babysitter")
        res = ettr.run_arms(model, [bs], [1800.0], 10, SEED)
        ettrs.append(res["arms"]["babysitter"][0]["ettr"])
    print(f"\nETTR at 1e-4: {ettrs[0]:.4f}, at 1e-2: {ettrs[1]:.4f}")
    assert ettrs[0] - ettrs[1] > 0.05


def test_fault_drain_figures_at_defaults_are_used_as_measured(inputs, tmp_path: Path):
    """fault_drain at default settings already includes the wait for the next poll: its
    samples become the arm's latency with nothing added on top."""
    details = {
        "samples_defaults": {"xid79": [0.1, 0.2], "dbe": [0.3], "ib_port_down_for_good": [0.7]}
    }
    (tmp_path / "fault_drain.json").write_text(json.dumps({"details": details}))
    arms, notes = ettr.build_arms(inputs, results_dir=tmp_path)
    bs = next(a for a in arms if a.name == "babysitter")
    assert bs.latency["xid_drained"].samples == (0.1, 0.2)
    assert bs.latency["ecc"].samples == (0.3,) and bs.latency["ecc"].poll_s == 0.0
    assert bs.latency["ib"].samples == (0.7,) and bs.latency["ib"].poll_s == 0.0
    assert any("measured, 2 samples" in n and "xid79" in n for n in notes)


def test_self_healing_brings_reboot_class_nodes_back_sooner(model, arms):
    """The two babysitter arms share every failure; with self-healing the nodes a reboot fixes
    are rebooted in the loop's measured time instead of after a human: fewer node-hours out
    for repair, and with few spare nodes a job that waits less for them. With spares to
    spare the job never waits, and the arms' ETTR is the same."""
    quiet = {"false_interruptions_per_node_day": 0.0, "false_drains_per_node_day": 0.0}
    off = dataclasses.replace(arms["babysitter"], **quiet)
    on = dataclasses.replace(arms[ettr.SELF_HEAL], **quiet)
    assert off.self_heal is None and on.self_heal is not None
    tight = ettr.run_arms(dataclasses.replace(model, spare_nodes=4), [off, on], [1800.0], 10, SEED)
    a, b = tight["arms"][off.name][0], tight["arms"][on.name][0]
    assert b["node_hours_out"] < a["node_hours_out"]
    assert b["ettr"] > a["ettr"]
    roomy = dataclasses.replace(model, spare_nodes=10**6)
    res = ettr.run_arms(roomy, [off, on], [1800.0], 10, SEED)
    assert res["arms"][off.name][0]["ettr"] == res["arms"][on.name][0]["ettr"]
