"""How a decision's reason names findings and nodes, kept short for alert titles and the API."""

from __future__ import annotations

from collections.abc import Sequence

from babysitter.finding import Finding


def summary(findings: Sequence[Finding]) -> str:
    """`<check>: <message>` of the worst finding, for drain reasons and alert titles."""
    worst = max(findings, key=lambda f: f.severity.rank)
    more = f" (+{len(findings) - 1} more)" if len(findings) > 1 else ""
    return f"{worst.check}: {worst.message}{more}"


def listed(names: list[str]) -> str:
    """The first ten names, and an ellipsis when there are more."""
    return f"{', '.join(names[:10])}{'…' if len(names) > 10 else ''}"
