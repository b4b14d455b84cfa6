"""NCCL / PyTorch job-log lines as real jobs printed them (tests/data/world/nccl): each line gets
the finding its failure deserves, whatever NCCL or PyTorch version worded it; benign lines get
none; a line that names an NCCL failure in an unknown wording is counted, never dropped."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from babysitter.checks import unparsed
from babysitter.checks.base import CheckContext
from babysitter.checks.nccl.check import JobLogScanner, NcclLogCheck
from babysitter.checks.nccl.signatures import match_line, names_nccl_failure
from babysitter.config import parse_config

CORPUS = Path(__file__).parent / "data" / "world" / "nccl" / "samples.jsonl"
SAMPLES: list[dict[str, Any]] = [
    json.loads(line) for line in CORPUS.read_text().splitlines() if line.strip()
]


@pytest.fixture(autouse=True)
def fresh_registry() -> Iterator[None]:
    unparsed.REGISTRY.clear()
    yield
    unparsed.REGISTRY.clear()


def test_the_corpus_is_large_and_has_benign_lines() -> None:
    assert len(SAMPLES) >= 50
    assert sum(s["expect"]["code"] is None for s in SAMPLES) >= 10


@pytest.mark.parametrize("sample", SAMPLES, ids=[s["id"] for s in SAMPLES])
def test_each_real_line_gets_its_finding(sample: dict[str, Any], tmp_path: Path) -> None:
    """Through the scanner the check runs: the finding's code and severity, or none."""
    log = tmp_path / "slurm-77.out"
    log.write_text(sample["text"] + "\n")
    found = JobLogScanner().scan("77", log, "node3")
    want = sample["expect"]
    got = [(f.code, str(f.severity)) for f in found]
    assert got == ([(want["code"], want["severity"])] if want["code"] else [])
    assert all(f.component == "job:77" for f in found)  # job-owned evidence, never the node's


def test_only_the_unknown_failure_wordings_are_counted_as_unparsed() -> None:
    unmatched = [s for s in SAMPLES if s["expect"]["code"] is None]
    assert [s["id"] for s in unmatched if names_nccl_failure(s["text"])] == [
        s["id"] for s in unmatched if s["expect"].get("unparsed")
    ]


def _by_id(sample_id: str) -> str:
    return next(s["text"] for s in SAMPLES if s["id"] == sample_id)


@pytest.mark.parametrize(
    ("older", "newer"),
    [
        ("ib-err12-old-902", "ib-status12-1814"),  # NCCL <= 2.9 vs 2.19+: IB error 12
        ("system-runtimeerror-fastmoe28", "remote-distbackend-2076"),  # before/after 2.13.4
        ("cuda-warn-629", "cuda-watchdog-vllm4108"),  # NCCL's vs PyTorch's CUDA failure
        ("wd-timeout-97066", "wd-terminated-pg-sglang1693"),  # watchdog wordings
    ],
)
def test_one_failure_is_rated_alike_in_every_wording(older: str, newer: str) -> None:
    old, new = match_line(_by_id(older)), match_line(_by_id(newer))
    assert old is not None and new is not None and old[1] == new[1]


def test_an_unknown_nccl_failure_wording_is_counted_and_sampled(tmp_path: Path) -> None:
    log = tmp_path / "slurm-4242.out"
    log.write_text(
        "step 10 loss 2.3\n"
        # matches no signature, names NCCL and a failure: counted
        + _by_id("unparsed-store-timeout-llamafactory3698")
        + "\n"
        # NCCL's INFO level: probing, never a failure
        + _by_id("info-failed-find-symbol-846")
        + "\n"
    )
    cfg = parse_config({"checks": {"nccl": {"job_log_globs": [str(tmp_path / "slurm-*.out")]}}})
    chk = NcclLogCheck(CheckContext(cfg, "node3"))
    chk.local_jobs = lambda: frozenset({"4242"})
    assert chk.run() == []
    snap = chk.metrics["unparsed_lines"]
    assert isinstance(snap, dict) and snap["job_log"]["total"] == 1
    [sample] = snap["job_log"]["samples"]
    assert "store->get('0') got error" in sample["line"]


def test_a_known_failure_is_a_finding_not_an_unparsed_line(tmp_path: Path) -> None:
    log = tmp_path / "slurm-5.out"
    log.write_text(_by_id("cuda-watchdog-vllm2682") + "\n")
    cfg = parse_config({"checks": {"nccl": {"job_log_globs": [str(tmp_path / "slurm-*.out")]}}})
    chk = NcclLogCheck(CheckContext(cfg, "node3"))
    chk.local_jobs = lambda: frozenset({"5"})
    [f] = chk.run()
    assert (f.code, f.severity, f.component) == ("nccl.cuda_error", "critical", "job:5")
    assert "unparsed_lines" not in chk.metrics
