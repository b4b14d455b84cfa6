"""Benchmark provenance (bench/provenance.py, bench/common.py, bench/report.py, bench/run.py):
every result records where it came from, a result older than the code it measures is marked
STALE, a failed benchmark fails `make bench` and its old figures are marked FAILED, and a figure
a run could not measure is shown as MISSING."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from bench import common, provenance, report, run


def _git(*args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(provenance.REPO), *args], capture_output=True, text=True, check=True
    ).stdout.strip()


@pytest.fixture
def results(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "results"
    d.mkdir()
    monkeypatch.setattr(common, "RESULTS_DIR", d)
    return d


def test_result_records_machine_commit_settings_and_load(results: Path):
    path = common.write_result(
        "sdc", [common.figure("x", 1.0, "s")], settings={"n": 256, "seed": 11}
    )
    doc = json.loads(path.read_text())
    m = doc["machine"]
    assert m["cpu"] and m["cores"] >= 1 and m["memory_gib"] > 0
    assert doc["commit"] == _git("rev-parse", "HEAD")
    assert isinstance(doc["dirty"], bool)
    assert doc["settings"] == {"n": 256, "seed": 11}
    assert doc["measures"] == list(provenance.MEASURES["sdc"])
    assert len(doc["load_average"]["start"]) == 3 and len(doc["load_average"]["end"]) == 3


def _doc(name: str, commit: str, **kw: object) -> dict[str, object]:
    return {"name": name, "commit": commit, "dirty": False, "figures": [], **kw}


def test_result_older_than_the_code_it_measures_is_stale():
    head = _git("rev-parse", "HEAD")
    assert not provenance.staleness(_doc("ettr", head)).stale
    last_change = _git("log", "-1", "--format=%H", "--", *provenance.MEASURES["ettr"])
    before = _git("rev-parse", f"{last_change}^")
    s = provenance.staleness(_doc("ettr", before))
    assert s.stale and "changed since" in s.why
    # a result measured on uncommitted code, or at a commit this repository does not have
    assert provenance.staleness(_doc("ettr", head, dirty=True)).stale
    assert "not in this repository" in provenance.staleness(_doc("ettr", "0" * 40)).why


def test_result_is_stale_when_its_inputs_were_measured_after_it():
    head = _git("rev-parse", "HEAD")
    ettr = _doc("ettr", head, date="2026-01-01T00:00:00Z")
    soak = _doc("soak", head, date="2026-01-02T00:00:00Z")
    s = provenance.staleness(ettr, {"soak": soak})
    assert s.stale and "soak" in s.why


def test_failed_benchmark_fails_the_run_and_its_old_figures_are_marked(results: Path):
    """`make bench` exits non-zero; the older JSON of the failed benchmark is still in
    RESULTS.md but under a FAILED banner, and a benchmark that exits 0 without writing its
    result counts as failed too."""
    old = _doc(
        "no_such_benchmark",
        _git("rev-parse", "HEAD"),
        date="2020-01-01T00:00:00Z",
        figures=[common.figure("old figure", 1.0, "s")],
    )
    (results / "no_such_benchmark.json").write_text(json.dumps(old))
    out = results.parent / "RESULTS.md"
    rc = run.main([], [("bench.no_such_benchmark", 60), ("this", 60)], results, out)
    assert rc == 1
    text = out.read_text()
    assert "**FAILED in the last run: 2**" in text
    section = text.split("## no_such_benchmark", 1)[1]
    assert section.lstrip().startswith("**FAILED in the last `make bench` (exit status 1)")
    assert "this: exited 0 without writing results/this.json" in text
    last = json.loads((results / report.LAST_RUN).read_text())
    assert last["benchmarks"]["this"]["status"].startswith("exited 0 without writing")


def test_missing_figure_is_reported_missing(results: Path):
    common.write_result(
        "ingest",
        [
            common.figure("ingest latency, sqlite", 0.005, "s"),
            common.missing("ingest latency, postgres", "s", "postgres unavailable: refused"),
        ],
    )
    text = report.render(*report.load(results), results)
    assert "**MISSING: 1**" in text
    assert "ingest: ingest latency, postgres (postgres unavailable: refused)" in text
    assert "| ingest latency, postgres | **MISSING** (postgres unavailable: refused) |" in text
