"""The user documentation stays true: README short and pointing at every docs/ page, every
relative link and anchor resolving, README's figures taken from bench/RESULTS.md, and one
on-call section (with a stable anchor) for every alert condition the controller can send."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
DOCS = sorted((REPO / "docs").glob("*.md"))
RESULTS = REPO / "bench" / "RESULTS.md"
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]", lambda m: "_" if m.group() == "_" else "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = FENCE.sub("", path.read_text())
    ids = set(re.findall(r'<a id="([^"]+)"></a>', text))
    ids |= {_slug(h) for h in re.findall(r"^#{1,6} (.+)$", text, re.M)}
    return ids


def test_readme_is_short_and_links_every_docs_page():
    text = README.read_text()
    assert len(text.splitlines()) <= 200
    assert DOCS, "docs/ is empty"
    for page in DOCS:
        assert f"(docs/{page.name})" in text, f"README does not link docs/{page.name}"


@pytest.mark.parametrize(
    "page", [README, *DOCS, REPO / "bench" / "history.md"], ids=lambda p: p.name
)
def test_relative_links_and_anchors_resolve(page: Path):
    text = FENCE.sub("", page.read_text())
    links = LINK.findall(text)
    assert links or page != README  # the pattern still finds links
    for link in links:
        if re.match(r"[a-z]+:", link):
            continue  # http(s), mailto: not checked here
        target, _, anchor = link.partition("#")
        dest = (page.parent / target).resolve() if target else page
        assert dest.exists(), f"{page.name}: broken link {link}"
        if anchor and dest.suffix == ".md":
            assert anchor in anchors(dest), f"{page.name}: {link}: no such anchor"


def _measured_values() -> list[str]:
    text = README.read_text()
    table = text.split("## Measured", 1)[1].split("\n## ", 1)[0]
    rows = [r for r in table.splitlines() if r.startswith("| ") and not r.startswith("| what")]
    values: list[str] = []
    for row in rows:
        result = row.strip("|").split("|")[-1]
        values += re.findall(r"\d[\d,]*(?:\.\d+)?", result)
    return values


def test_readme_figures_come_from_bench_results():
    # the measured table, not the hand-written history below it
    results = RESULTS.read_text().split("\n## How to read", 1)[0].replace(",", "")
    values = _measured_values()
    assert len(values) >= 15
    for v in values:
        assert re.search(rf"(?<![\d.]){re.escape(v.replace(',', ''))}(?![\d])", results), (
            f"README quotes {v}, which bench/RESULTS.md does not have"
        )


def _resolve(node: ast.AST, scope: dict[str, ast.AST]) -> str | None:
    """A condition expression as text; an f-string's fields become '_' (a family)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.Name) and node.id in scope:
        return _resolve(scope[node.id], scope)
    if isinstance(node, ast.JoinedStr):
        parts = []
        for v in node.values:
            if isinstance(v, ast.Constant):
                parts.append(str(v.value))
            elif isinstance(v, ast.FormattedValue) and isinstance(v.value, ast.Name):
                parts.append(_resolve(v.value, scope) or "_")
            else:
                parts.append("_")
        return "".join(parts)
    return None


def alert_conditions() -> set[str]:
    """Every condition an Alert or a policy Decision is made with in the controller."""
    found: set[str] = set()
    for path in (REPO / "babysitter" / "controller").rglob("*.py"):
        tree = ast.parse(path.read_text())
        module = {
            t.id: n.value
            for n in tree.body
            if isinstance(n, ast.Assign)
            for t in n.targets
            if isinstance(t, ast.Name)
        }
        for fn in ast.walk(tree):
            if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            scope = dict(module)
            for n in ast.walk(fn):
                if isinstance(n, ast.Assign) and isinstance(n.targets[0], ast.Name):
                    scope[n.targets[0].id] = n.value
            for call in ast.walk(fn):
                if not isinstance(call, ast.Call) or not isinstance(call.func, ast.Name):
                    continue
                arg = None
                if call.func.id == "Alert" and len(call.args) > 1:
                    arg = call.args[1]
                elif call.func.id == "Decision":
                    kw = [k.value for k in call.keywords if k.arg == "condition"]
                    arg = kw[0] if kw else (call.args[5] if len(call.args) > 5 else None)
                text = _resolve(arg, scope) if arg is not None else None
                if text:
                    found.add(re.sub(r"_+", "_", text).strip("_"))
    return found


def test_operations_has_a_section_for_every_alert_the_controller_sends():
    from babysitter.controller.loop.decide.stragglers import CONDITION
    from babysitter.controller.loop.record.alerts.model import RUNBOOK

    conditions = alert_conditions() | {CONDITION}  # facts.py raises it by the imported name
    # the scan must see the controller's alerts, or this test proves nothing
    assert {"node_unhealthy", "guard_tripped", "job_hung", "xid_repeated"} <= conditions
    assert len(conditions) >= 12
    ops = anchors(REPO / "docs" / "operations.md")
    missing = sorted(c for c in conditions | set(RUNBOOK) if c not in ops)
    assert not missing, f"docs/operations.md has no section (anchor) for {missing}"
