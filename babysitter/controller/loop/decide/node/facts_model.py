"""What the policy decides from: its settings, one node's facts and the cluster's (gathered by
loop/read/facts.py; no I/O here)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from babysitter.finding import Finding

if TYPE_CHECKING:
    from babysitter.config import Config


@dataclass(frozen=True)
class PolicySettings:
    dry_run: bool = False
    max_drained_fraction: float = 0.1
    min_drainable: int = 1
    max_drains_per_hour: int = 20
    resume_after_clean_checks: int = 3
    heartbeat_timeout_s: float = 120.0
    validate_before_resume: bool = False
    validation_max_attempts: int = 3
    xid_escalation_count: int = 5
    xid_escalation_window_h: float = 24.0
    lemon_drains: int = 3
    lemon_window_days: float = 7.0

    @classmethod
    def from_config(cls, cfg: Config) -> PolicySettings:
        p = cfg.policy
        return cls(
            dry_run=p.dry_run,
            max_drained_fraction=p.max_drained_fraction,
            min_drainable=p.min_drainable,
            max_drains_per_hour=p.max_drains_per_hour,
            resume_after_clean_checks=p.resume_after_clean_checks,
            heartbeat_timeout_s=cfg.controller.heartbeat_timeout_s,
            validate_before_resume=cfg.validation.enabled(p),
            validation_max_attempts=cfg.validation.max_attempts,
            xid_escalation_count=p.xid_escalation_count,
            xid_escalation_window_h=p.xid_escalation_window_h,
            lemon_drains=p.lemon_drains,
            lemon_window_days=p.lemon_window_days,
        )

    @property
    def xid_window(self) -> timedelta:
        return timedelta(hours=self.xid_escalation_window_h)

    @property
    def lemon_window(self) -> timedelta:
        return timedelta(days=self.lemon_window_days)


@dataclass(frozen=True)
class NodeFacts:
    name: str
    open_findings: tuple[Finding, ...] = ()
    consecutive_clean: int = 0
    heartbeat_age_s: float | None = None
    partitions: tuple[str, ...] = ("default",)
    drained: bool = False  # Slurm shows DRAIN (or DOWN) on it
    reason: str = ""
    ours: bool = False  # the reason is babysitter's (or a dry-run drain of ours)
    in_slurm: bool = True
    drain_pending: bool = False  # a drain action is already queued
    recent_drains: tuple[datetime, ...] = ()  # babysitter drains of this node
    xid_history: tuple[tuple[str, int, datetime], ...] = ()  # (component, xid, when)
    validation: str = ""  # latest validation since babysitter last drained it (db/episodes.py)
    validation_failures: int = 0


@dataclass(frozen=True)
class ClusterFacts:
    # empty = unknown (Slurm never read): the guard cannot size anything and decides no drain
    partition_sizes: dict[str, int] = field(default_factory=dict)
    drained_by_us: dict[str, int] = field(default_factory=dict)
    drains_last_hour: int = 0
    guard_tripped: bool = False
