"""Render bench/results/*.json into bench/RESULTS.md (one table, goals flagged loudly)."""

from __future__ import annotations

import json
import sys
from typing import Any

from bench.common import BENCH_DIR, RESULTS_DIR


def _fmt(v: Any) -> str:
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        if v != v:  # nan
            return "n/a"
        return f"{v:.4g}"
    return "" if v is None else str(v)


def render(results: list[dict[str, Any]]) -> str:
    out = ["# Benchmark results", ""]
    if results:
        m = results[0].get("machine", {})
        out.append(
            f"Machine: {m.get('cpu', '?')} ({m.get('cores', '?')} cores), "
            f"Python {m.get('python', '?')}; commit {results[0].get('commit', '?')}; "
            f"generated from bench/results/*.json by `make bench`."
        )
        out.append("")
        out.append("Every figure is measured beside its baseline in the same run.")
    missed = [
        (r["name"], f)
        for r in results
        for f in r.get("figures", [])
        if f.get("goal") is not None and not f.get("met")
    ]
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
        out.append("All goals met in this run.")
    out += [
        "",
        "| benchmark | metric | value | unit | p50 | p99 | spread | n | baseline | ratio | goal "
        "| met |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        for f in r.get("figures", []):
            baseline = ""
            if f.get("baseline"):
                baseline = f"{f['baseline']} = {_fmt(f.get('baseline_value'))}"
            met = f.get("met")
            met_s = "" if met is None else ("yes" if met else "**MISSED**")
            out.append(
                "| "
                + " | ".join(
                    [
                        r["name"],
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
                        met_s,
                    ]
                )
                + " |"
            )
    out.append("")
    for r in results:
        out.append(f"- `{r['name']}`: {r.get('date', '?')}, {r.get('duration_s', '?')} s")
    notes = sorted(RESULTS_DIR.glob("*.md"))
    if notes:  # longer write-ups some benchmarks keep beside their JSON
        out.append("")
        out += [f"- notes: [{p.stem}](results/{p.name})" for p in notes]
    return "\n".join(out) + "\n"


def main() -> int:
    results = []
    for p in sorted(RESULTS_DIR.glob("*.json")):
        try:
            doc = json.loads(p.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            print(f"skipping unreadable {p}: {exc}", file=sys.stderr)
            continue
        if isinstance(doc, dict) and "figures" in doc:
            doc.setdefault("name", p.stem)
            results.append(doc)
    (BENCH_DIR / "RESULTS.md").write_text(render(results))
    print(f"wrote {BENCH_DIR / 'RESULTS.md'} from {len(results)} result files")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
