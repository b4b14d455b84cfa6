"""The README's configuration reference is generated from the pydantic models; keep it in sync."""

from pathlib import Path

from babysitter.config_docs import splice

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_config_reference_matches_models():
    text = README.read_text()
    assert splice(text) == text, (
        "README configuration reference is stale: run `python -m babysitter.config_docs --write`"
    )


def test_reference_names_every_section():
    text = README.read_text()
    for section in ("[agent]", "[controller]", "[slurm]", "[policy]", "[alerts]", "[checks.gpu]"):
        assert f"`{section}`" in text
