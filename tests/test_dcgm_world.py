"""`dcgmi diag -j` as DCGM printed it (tests/data/world/dcgm/): every sample of the corpus,
judged by checks/dcgm/diag.py, means what its `expect` says: pass or not, which tests failed,
which DCGM major version's shape it is, and (for a diag that could not run) the cause named in
the failure that reaches the validation record."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from babysitter.checks.dcgm import causes, diag

CORPUS = Path(__file__).parent / "data" / "world" / "dcgm"
SAMPLES = [json.loads(line) for line in (CORPUS / "samples.jsonl").read_text().splitlines()]
CAUSES = {"hostengine": causes.HOSTENGINE, "too_old": causes.TOO_OLD}
SHAPES = {"2": "2.x/3.x", "3": "2.x/3.x", "4": "4.x"}


def _bytes(s: dict[str, Any]) -> str:
    return (CORPUS / s["file"]).read_text() if "file" in s else s["text"]


@pytest.mark.parametrize("s", SAMPLES, ids=[s["id"] for s in SAMPLES])
def test_each_real_sample_is_judged_as_it_means(s: dict[str, Any]) -> None:
    e = s["expect"]
    res = diag.judge(3, _bytes(s), e["exit"], 60)
    assert res.ok is e["ok"], res.failures
    assert [t.name for t in res.tests if t.status == diag.FAIL] == e["failed_tests"]
    for name in e["failed_tests"]:  # the failing test is named where the admin reads it
        assert any(f.startswith(f"dcgmi diag -r 3: {name} failed") for f in res.failures)
    if not e["ok"]:
        assert res.failures
    if e.get("cause"):
        assert res.failures[0].startswith(f"dcgmi diag -r 3: {CAUSES[e['cause']]}: ")
    elif e["version_major"]:
        # a document: the shape of its major version, and the version where it names one
        assert res.shape == SHAPES[e["version_major"]]
        assert not res.version or res.version.split(".")[0] == e["version_major"]


def test_the_corpus_covers_every_major_version_passing_and_failing() -> None:
    seen = {(s["expect"]["version_major"], s["expect"]["ok"]) for s in SAMPLES}
    for major in ("2", "3", "4"):
        assert {(major, True), (major, False)} <= seen, major
    assert any(s["category"] == "hostengine_down" for s in SAMPLES)
