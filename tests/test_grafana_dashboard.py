"""The shipped Grafana dashboard (deploy/grafana): it is what its builder (Grafana's
grafana-foundation-sdk) makes, it holds the essentials of Grafana's dashboard schema, and every
query — and every Prometheus rule — names only metrics a running controller exports."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import yaml
from fastapi.testclient import TestClient

from babysitter.controller.runtime import Controller
from tests.fixtures.controller import controller_config
from tests.fixtures.reports import DBE, wire_report

ROOT = Path(__file__).resolve().parent.parent
BUILDER = ROOT / "deploy" / "grafana" / "build_dashboard.py"
DASHBOARD = ROOT / "deploy" / "grafana" / "babysitter-dashboard.json"
RULES = ROOT / "deploy" / "prometheus" / "babysitter-rules.yml"
PANEL_TYPES = {"row", "stat", "timeseries"}
METRIC = re.compile(r"\bbabysitter_[a-z0-9_]+\b")


def board() -> dict:
    return json.loads(DASHBOARD.read_text())


def panels() -> list[dict]:
    return [p for p in board()["panels"] if p["type"] != "row"]


def test_dashboard_is_what_the_builder_makes():
    spec = importlib.util.spec_from_file_location("build_dashboard", BUILDER)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert DASHBOARD.read_text() == mod.render(), (
        "deploy/grafana/babysitter-dashboard.json is stale: run "
        ".venv/bin/python deploy/grafana/build_dashboard.py --write"
    )


def test_dashboard_has_the_schema_essentials():
    b = board()
    assert b["uid"] and b["title"] and b["schemaVersion"] >= 36
    variables = {v["name"]: v for v in b["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    ids = [p["id"] for p in b["panels"]]
    assert len(ids) == len(set(ids)) and all(isinstance(i, int) and i > 0 for i in ids)
    cells: set[tuple[int, int]] = set()
    for p in b["panels"]:
        assert p["type"] in PANEL_TYPES, p
        g = p["gridPos"]
        assert g["x"] >= 0 and g["x"] + g["w"] <= 24 and g["h"] > 0, p["title"]
        mine = {
            (x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])
        }
        assert not cells & mine, f"{p['title']} overlaps another panel"
        cells |= mine
    for p in panels():
        assert p["title"] and p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        refs = [t["refId"] for t in p["targets"]]
        assert refs and len(refs) == len(set(refs)), p["title"]
        assert all(t["expr"].strip() for t in p["targets"]), p["title"]


def test_dashboard_shows_what_on_call_needs():
    titles = " | ".join(p["title"].lower() for p in panels())
    for topic in (
        "verdict",
        "drains by reason",
        "drain age",
        "fault -> drain",
        "requeues",
        "alert notifications",
        "loop tick",
        "ingest latency",
        "per leaf switch",
        "stuck drains",
        "drained nodes by owner",
    ):
        assert topic in titles, topic


def exported(metrics_text: str) -> set[str]:
    """Every series name the exposition can carry, from its TYPE lines."""
    names: set[str] = set()
    for name, kind in re.findall(r"^# TYPE (\S+) (\S+)$", metrics_text, re.M):
        names.add(name)
        if kind == "histogram":
            names |= {f"{name}_bucket", f"{name}_sum", f"{name}_count"}
        if kind == "counter":
            names.add(name.removesuffix("_total") + "_created")
    return names


def unknown(exprs: list[str], names: set[str]) -> set[str]:
    return {m for e in exprs for m in METRIC.findall(e)} - names


def scrape(secrets, tmp_path) -> str:
    c = Controller(controller_config(secrets, f"sqlite:///{tmp_path / 'm.db'}"))
    c.setup()
    try:
        api = TestClient(c.app())
        api.post(
            "/api/v1/reports", json=wire_report("node1", [DBE]), headers=secrets.headers("node1")
        )
        r = api.get("/metrics")
        assert r.status_code == 200
        return r.text
    finally:
        c.close()


def test_every_query_names_a_metric_the_controller_exports(secrets, tmp_path):
    names = exported(scrape(secrets, tmp_path))
    exprs = [t["expr"] for p in panels() for t in p["targets"]]
    assert unknown(exprs, names) == set()
    groups = yaml.safe_load(RULES.read_text())["groups"]
    assert unknown([r["expr"] for g in groups for r in g["rules"]], names) == set()
    # the check bites: a query naming a metric nobody exports is caught
    assert unknown(["rate(babysitter_drains_totl[5m])"], names) == {"babysitter_drains_totl"}
