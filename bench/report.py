"""Render bench/results/*.json into bench/RESULTS.md: one section per benchmark with its own
provenance (machine, commit, date, load, settings), goals flagged loudly, and every result that
is not a measurement of today's code said so at the top: STALE (older than the code it
measures), FAILED (its benchmark failed in the last `make bench`, the figures are an older
run's) and MISSING (a figure the run could not measure). bench/history.md, the hand-written guide
to reading the figures and how they changed, follows the sections."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from bench import provenance
from bench.common import BENCH_DIR, RESULTS_DIR

LAST_RUN = "last_run.json"  # what `make bench` ran and how each benchmark ended (bench/run.py)
INLINE = ("soak", "ettr", "nhc")  # write-ups shown inside their section, not only linked
HISTORY = BENCH_DIR / "history.md"


def _fmt(v: Any) -> str:
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        if v != v:  # nan
            return "n/a"
        return f"{v:.4g}"
    return "" if v is None else str(v)


def _settings(s: dict[str, Any]) -> str:
    if not s:
        return "not recorded"
    return "; ".join(f"{k} = {json.dumps(v, default=str)}" for k, v in s.items())


def _machine(m: dict[str, Any]) -> str:
    mem = m.get("memory_gib")
    return (
        f"{m.get('cpu', '?')}, {m.get('cores', '?')} cores"
        + (f", {mem:g} GiB memory" if isinstance(mem, int | float) else ", memory not recorded")
        + f", host {m.get('hostname', '?')}, Python {m.get('python', '?')}"
    )


def _load(doc: dict[str, Any]) -> str:
    la = doc.get("load_average")
    if not isinstance(la, dict):
        return "not recorded"
    fmt = lambda xs: "/".join(f"{x:g}" for x in xs) if xs else "?"  # noqa: E731
    return f"{fmt(la.get('start'))} at start, {fmt(la.get('end'))} at end (1/5/15 min)"


def _table(doc: dict[str, Any]) -> list[str]:
    out = [
        "| metric | value | unit | p50 | p99 | spread | n | baseline | ratio | goal | met |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for f in doc.get("figures", []):
        if f.get("missing"):
            out.append(
                f"| {f['metric']} | **MISSING** ({f['missing']}) | {f.get('unit', '')} "
                "| | | | | | | | |"
            )
            continue
        baseline = ""
        if f.get("baseline"):
            baseline = f"{f['baseline']} = {_fmt(f.get('baseline_value'))}"
        met = f.get("met")
        cells = [
            f["metric"],
            _fmt(f.get("value")),
            f.get("unit", ""),
            _fmt(f.get("p50")),
            _fmt(f.get("p99")),
            _fmt(f.get("spread")),
            _fmt(f.get("n")),
            baseline,
            _fmt(f.get("ratio")),
            f.get("goal") or "",
            "" if met is None else ("yes" if met else "**MISSED**"),
        ]
        out.append("| " + " | ".join(cells) + " |")
    return out


def render(
    results: list[dict[str, Any]],
    last_run: dict[str, Any] | None = None,
    results_dir: Path = RESULTS_DIR,
    history: Path | None = None,
) -> str:
    by_name = {r["name"]: r for r in results}
    runs = (last_run or {}).get("benchmarks", {})
    stale = {r["name"]: provenance.staleness(r, by_name) for r in results}
    failed = {n: s for n, s in runs.items() if s.get("status") != "ok"}
    missing = [(r["name"], f) for r in results for f in r.get("figures", []) if f.get("missing")]
    missed = [
        (r["name"], f)
        for r in results
        for f in r.get("figures", [])
        if f.get("goal") is not None and not f.get("met") and not f.get("missing")
    ]
    out = [
        "# Benchmark results",
        "",
        "Generated from bench/results/*.json by `make bench` (bench/report.py). Each section "
        "names the machine, commit, date, load and settings of its own run: results come from "
        "different runs. A result older than the code it measures is marked **STALE**, one "
        "whose benchmark failed in the last `make bench` **FAILED** (its figures are an older "
        "run's), a figure a run could not measure **MISSING**.",
        "",
    ]
    if last_run:
        out.append(
            f"Last `make bench`: started {last_run.get('started', '?')}, ran "
            + ", ".join(f"{n} ({s.get('status')})" for n, s in runs.items())
            + "."
        )
        out.append("")
    for label, items in (
        ("FAILED in the last run", [f"{n}: {s.get('status')}" for n, s in failed.items()]),
        ("STALE", [f"{n}: {s.why}" for n, s in stale.items() if s.stale]),
        ("MISSING", [f"{n}: {f['metric']} ({f['missing']})" for n, f in missing]),
    ):
        if items:
            out.append(f"**{label}: {len(items)}**")
            out += [f"- {x}" for x in items]
            out.append("")
    if missed:
        out.append(f"**GOALS MISSED: {len(missed)}**")
        for name, f in missed:
            # a goal on the p99 is missed by the p99: show that, not the value (the p50)
            p99 = str(f.get("goal", "")).startswith("p99") and f.get("p99") is not None
            shown = f"p99 {_fmt(f['p99'])}" if p99 else _fmt(f.get("value"))
            out.append(
                f"- **MISSED** {name}: {f['metric']} = {shown} "
                f"{f.get('unit', '')} (goal {f['goal']})"
            )
    else:
        out.append("All goals met in the results below.")
    for r in results:
        name = r["name"]
        out += ["", f"## {name}", ""]
        if name in failed:
            out.append(
                f"**FAILED in the last `make bench` ({failed[name].get('status')})**: the "
                f"figures below are from the earlier run of {r.get('date', '?')}."
            )
            out.append("")
        if stale[name].stale:
            out.append(f"**STALE**: {stale[name].why}.")
            out.append("")
        commit = str(r.get("commit", "?"))
        dirty = r.get("dirty")
        code = (
            "uncommitted changes: " + ", ".join(r.get("dirty_paths") or ["?"])
            if dirty
            else ("clean tree" if dirty is False else "tree state not recorded")
        )
        out += [
            f"- machine: {_machine(r.get('machine', {}))}",
            f"- commit: {commit[:12]} ({code})",
            f"- date: {r.get('date', '?')}, took {r.get('duration_s', '?')} s",
            f"- load average: {_load(r)}",
            f"- settings: {_settings(r.get('settings') or {})}",
            "",
        ]
        out += _table(r)
        note = results_dir / f"{name}.md"
        if name in INLINE and note.exists():
            out += ["", note.read_text().strip()]
        elif note.exists():
            out += ["", f"Notes: [{name}](results/{note.name})"]
    if history is not None and history.exists():
        out += ["", history.read_text().rstrip()]
    return "\n".join(out) + "\n"


def load(results_dir: Path = RESULTS_DIR) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    results = []
    last_run = None
    for p in sorted(results_dir.glob("*.json")):
        try:
            doc = json.loads(p.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            print(f"skipping unreadable {p}: {exc}", file=sys.stderr)
            continue
        if p.name == LAST_RUN:
            last_run = doc if isinstance(doc, dict) else None
        elif isinstance(doc, dict) and "figures" in doc:
            doc.setdefault("name", p.stem)
            results.append(doc)
    return results, last_run


def main(results_dir: Path = RESULTS_DIR, out: Path = BENCH_DIR / "RESULTS.md") -> int:
    results, last_run = load(results_dir)
    out.write_text(render(results, last_run, results_dir, HISTORY))
    print(f"wrote {out} from {len(results)} result files")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
