"""Lines a test hands to the end of the run: `record_property(SUMMARY, line)` in a test, printed
in the terminal summary (under xdist too: a worker's own output never reaches the terminal,
its reports' user properties do). The safety invariants print their counts of sequences,
steps and situations reached this way (tests/test_invariants.py)."""

from __future__ import annotations

import pytest

SUMMARY = "summary"


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    lines = [
        str(value)
        for reports in terminalreporter.stats.values()
        for rep in reports
        if getattr(rep, "when", None) == "call"
        for name, value in getattr(rep, "user_properties", ())
        if name == SUMMARY
    ]
    if lines:
        terminalreporter.section("summary lines")
        for line in lines:
            terminalreporter.line(line)
