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
    names = ["babysitter", "NHC every 300 s", "no health tool", ettr.IDEAL]
    res = ettr.run_arms(model, [arms[n] for n in names], [1800.0], REPLICAS, SEED)
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
    assert any("wrong drains: NOT MEASURED" in n for n in notes)
    bs = next(a for a in arms if a.name == "babysitter")
    assert bs.latency["xid"].samples == (inputs["babysitter"]["fallback_drain_s"],)
    # a measured wrong-drain figure replaces the assumption
    (tmp_path / "reliability.json").write_text(
        json.dumps({"figures": [{"metric": "false drains per node-day", "value": 0.002}]})
    )
    arms, notes = ettr.build_arms(inputs, results_dir=tmp_path)
    assert next(a for a in arms if a.name == "babysitter").false_drains_per_node_day == 0.002


def test_fault_drain_figures_at_defaults_are_used_as_measured(inputs, tmp_path: Path):
    """fault_drain at default settings already includes the wait for the next poll: its
    samples become the arm's latency with nothing added on top."""
    details = {"samples_defaults": {"xid79": [0.1, 0.2], "dbe": [0.3], "ib_port_down": [0.7]}}
    (tmp_path / "fault_drain.json").write_text(json.dumps({"details": details}))
    arms, notes = ettr.build_arms(inputs, results_dir=tmp_path)
    bs = next(a for a in arms if a.name == "babysitter")
    assert bs.latency["xid"].samples == (0.1, 0.2)
    assert bs.latency["ecc"].samples == (0.3,) and bs.latency["ecc"].poll_s == 0.0
    assert bs.latency["ib"].samples == (0.7,) and bs.latency["ib"].poll_s == 0.0
    assert any("measured, 2 samples" in n and "xid79" in n for n in notes)
