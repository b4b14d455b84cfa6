"""The report: what an agent sends every interval (or at once, for an event) and what the
controller validates and stores. One model for both sides, so the agent cannot build a report
the API does not take. Wire format: docs/architecture.md (POST /api/v1/reports).

Kept free of anything heavier than pydantic and `finding`: the agent imports it on every node.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from babysitter.finding import Finding

NODE_NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
# A node has a few dozen components; this leaves room for a big node and stops a bad one
# from filling the store.
MAX_FINDINGS_PER_REPORT = 1000

ReportKind = Literal["full", "event"]


class Report(BaseModel):
    # A newer agent's fields this controller does not know are ignored, never refused: a
    # refused report blinds the controller to the node (babysitter/wire.py, the skew policy).
    model_config = ConfigDict(extra="ignore")

    node: str = Field(pattern=NODE_NAME)
    report_id: uuid.UUID = Field(description="the agent's id: a retried report is stored once")
    sent_at: datetime
    findings: list[Finding] = Field(max_length=MAX_FINDINGS_PER_REPORT)
    metrics: dict[str, Any] = Field(default_factory=dict)
    # "event": pushed at once by an event source, merges into the node's open findings
    kind: ReportKind = "full"
    # the sender's wire version when it says so in the body (agents from wire 3 on); agents of
    # wire 1 and 2 say it in the X-Babysitter-Wire header, or not at all (wire 1)
    wire_version: int = Field(default=1, ge=1)

    @classmethod
    def new(
        cls,
        node: str,
        findings: Iterable[Finding],
        metrics: dict[str, Any],
        kind: ReportKind = "full",
    ) -> Report:
        """A fresh report, as the agent makes it. Not validated here: its findings are
        `Finding`s already, and a report the controller refuses (a node name it does not
        take, too many findings) is the controller's 422 to give and the shipper's to count,
        not an exception in an agent thread."""
        return cls.model_construct(
            node=node,
            report_id=uuid.uuid4(),
            sent_at=datetime.now(UTC),
            findings=list(findings),
            metrics=metrics,
            kind=kind,
        )

    def to_json_dict(self) -> dict[str, Any]:
        """The report as it goes on the wire (and into the agent's spool). Without
        `wire_version`: a controller of the previous release (wire 1) refuses unknown keys;
        the version goes in the X-Babysitter-Wire header (babysitter/wire.py)."""
        return {
            "node": self.node,
            "report_id": str(self.report_id),
            "sent_at": self.sent_at.isoformat(),
            "kind": self.kind,
            "findings": [f.to_json_dict() for f in self.findings],
            "metrics": self.metrics,
        }
