"""Shared pytest set-up. Area fixtures live in tests/fixtures/<area>.py and are listed here."""

pytest_plugins: list[str] = [
    # "tests.fixtures.<area>",
    "tests.fixtures.slurm",
    "tests.fixtures.gpu",
    "tests.fixtures.controller",
    "tests.fixtures.alerts",
    "tests.fixtures.users",
]
