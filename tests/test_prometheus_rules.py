"""The shipped Prometheus rules (deploy/prometheus): promtool checks them and runs their unit
tests; every alert has a firing and a not-firing case there and a runbook section in the
docs; and the tests bite (a broken threshold fails them)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import yaml

from tests.fixtures.controller import which

ROOT = Path(__file__).resolve().parent.parent
RULES_DIR = ROOT / "deploy" / "prometheus"
RULES = RULES_DIR / "babysitter-rules.yml"
TESTS = RULES_DIR / "babysitter-rules.test.yml"


def promtool(*args: str, cwd: Path = RULES_DIR) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [which("promtool"), *args], cwd=cwd, capture_output=True, text=True, timeout=120
    )


def alert_rules() -> list[dict]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [r for g in groups for r in g["rules"] if "alert" in r]


def test_promtool_checks_the_rules():
    r = promtool("check", "rules", str(RULES))
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"SUCCESS: {len(alert_rules()) + 5} rules found" in r.stdout


def test_promtool_unit_tests_pass():
    r = promtool("test", "rules", str(TESTS))
    assert r.returncode == 0, r.stdout + r.stderr


def test_every_alert_has_a_firing_and_a_not_firing_case():
    cases: dict[str, set[str]] = {}
    for t in yaml.safe_load(TESTS.read_text())["tests"]:
        for c in t.get("alert_rule_test", []):
            cases.setdefault(c["alertname"], set()).add("fires" if c["exp_alerts"] else "quiet")
    for rule in alert_rules():
        assert cases.get(rule["alert"]) == {"fires", "quiet"}, rule["alert"]


def anchors(doc: Path) -> set[str]:
    """The anchors GitHub makes of a Markdown file's headings."""
    return {
        re.sub(r"[^a-z0-9 _-]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
        for line in doc.read_text().splitlines()
        if line.startswith("#")
    }


def test_every_alert_links_to_its_runbook_section():
    for rule in alert_rules():
        url = rule["annotations"]["runbook_url"]
        doc, _, anchor = url.partition("#")
        assert doc.startswith("docs/") and (ROOT / doc).is_file(), url
        assert anchor in anchors(ROOT / doc), f"{rule['alert']}: no section #{anchor} in {doc}"


def test_a_broken_rule_fails_its_unit_test(tmp_path):
    shutil.copy(TESTS, tmp_path / TESTS.name)
    text = RULES.read_text()
    broken = text.replace("babysitter_guard_tripped == 1", "babysitter_guard_tripped == 2")
    assert broken != text
    (tmp_path / RULES.name).write_text(broken)
    r = promtool("test", "rules", TESTS.name, cwd=tmp_path)
    assert r.returncode != 0 and "BabysitterGuardTripped" in r.stdout + r.stderr
