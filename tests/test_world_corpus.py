"""The corpus of real outputs (tests/data/world/README.md): every sample names where its bytes
come from and how they were captured, and the run's summary counts the corpus by source kind,
captured and category. Each parser's table test over its folder lives beside the parser's
other tests (test_dcgm_world, test_kmsg_world, test_xid_catalog, test_nccl_world,
test_fabric_world, test_slurm_world)."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.summary_lines import SUMMARY

WORLD = Path(__file__).parent / "data" / "world"
CAPTURED = {"machine", "fixture", "derived"}
REQUIRED = ("id", "source", "captured", "category", "expect")
# a file of a public repository (github:owner/repo/path, pinned to a commit or tag where known),
# a public page (an issue thread, a documentation page), or this project's own capture from a
# real daemon (capture:<the README that says how>)
SOURCE = re.compile(r"^(github:[\w.-]+/[\w.-]+/\S+|https?://\S+|capture:tests/\S+)")


def _samples() -> list[tuple[str, dict[str, Any]]]:
    out = []
    for path in sorted(WORLD.glob("*/samples.jsonl")):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if line.strip():
                try:
                    out.append((path.parent.name, json.loads(line)))
                except ValueError as exc:
                    raise AssertionError(f"{path}:{n}: not JSON: {exc}") from None
    return out


SAMPLES = _samples()


def test_every_sample_has_provenance_and_bytes() -> None:
    assert SAMPLES, "no corpus found under tests/data/world"
    seen: set[tuple[str, str]] = set()
    for kind, s in SAMPLES:
        where = f"{kind}/{s.get('id')}"
        missing = [k for k in REQUIRED if k not in s]
        assert not missing, f"{where}: missing {missing}"
        assert (kind, s["id"]) not in seen, f"{where}: id used twice"
        seen.add((kind, s["id"]))
        assert SOURCE.match(s["source"]), f"{where}: source {s['source']!r} is not a repo or URL"
        assert s["captured"] in CAPTURED, f"{where}: captured {s['captured']!r}"
        if s["captured"] == "derived":
            assert s.get("note"), f"{where}: a derived sample says what was changed"
        if "file" in s:
            assert (WORLD / kind / s["file"]).is_file(), f"{where}: {s['file']} missing"
        else:
            assert isinstance(s.get("text"), str) and s["text"], f"{where}: no text"


def test_each_folder_says_what_its_samples_mean() -> None:
    for kind in {k for k, _ in SAMPLES}:
        assert (WORLD / kind / "README.md").is_file(), f"{kind}/README.md missing"


def test_corpus_counts(record_property: pytest.RecordProperty) -> None:
    """The corpus by source kind, captured and category (printed at the end of `make test`)."""
    by_kind = Counter(k for k, _ in SAMPLES)
    by_captured = Counter(s["captured"] for _, s in SAMPLES)
    by_category = Counter(f"{k}/{s['category']}" for k, s in SAMPLES)
    line = (
        f"world corpus: {len(SAMPLES)} samples; by kind "
        + ", ".join(f"{k} {n}" for k, n in sorted(by_kind.items()))
        + "; captured "
        + ", ".join(f"{k} {n}" for k, n in sorted(by_captured.items()))
        + "; by category "
        + ", ".join(f"{k} {n}" for k, n in sorted(by_category.items()))
    )
    record_property(SUMMARY, line)
    print(line)
    assert len(SAMPLES) >= 200, line
