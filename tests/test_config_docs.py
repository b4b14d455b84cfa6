"""docs/config.md, the configuration reference, is generated from the config models
(babysitter.config) and must be current: a key added without regenerating fails here."""

import subprocess
import sys
from pathlib import Path

import msgspec

from babysitter.config import ChecksConfig, Config
from babysitter.config_docs import WRITE, page
from babysitter.settings import section_fields

REPO = Path(__file__).resolve().parents[1]
PAGE = REPO / "docs" / "config.md"


def test_docs_config_md_is_current():
    assert PAGE.read_text() == page(), f"docs/config.md is stale: run `{WRITE}`"


def test_every_key_of_every_section_is_documented():
    text = PAGE.read_text()
    for name, model in section_fields(Config).items():
        sections = (
            {f"checks.{c}": m for c, m in section_fields(ChecksConfig).items()}
            if model is ChecksConfig
            else {name: model}
        )
        for section, smodel in sections.items():
            head = f"### `[{section}]`"
            assert head in text, head
            body = text.split(head, 1)[1].split("\n### ", 1)[0]
            for field in msgspec.structs.fields(smodel):
                assert f"| `{field.name}` |" in body, f"[{section}] {field.name}"


def test_the_check_mode_fails_on_a_stale_page(tmp_path: Path):
    stale = tmp_path / "config.md"
    stale.write_text(page().replace("| `dry_run` |", "| `dry_run_old` |"))
    cmd = [sys.executable, "-m", "babysitter.config_docs", str(stale)]
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=60)
    assert r.returncode == 1 and "stale" in r.stderr
    subprocess.run([*cmd, "--write"], check=True, cwd=REPO, timeout=60)
    assert stale.read_text() == page()
    assert subprocess.run(cmd, cwd=REPO, timeout=60).returncode == 0


def test_readme_links_the_reference_instead_of_carrying_it():
    readme = (REPO / "README.md").read_text()
    assert "(docs/config.md)" in readme
    assert "| `dry_run` |" not in readme  # the generated tables live in docs/ only
