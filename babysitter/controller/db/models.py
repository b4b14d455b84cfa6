"""Database schema (SQLAlchemy Core). Migrations in sql/ (Alembic) must match it;
sql/schema.sql is generated from it for DBAs (tests keep both in sync)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Column,
    DateTime,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
)

metadata = MetaData()

nodes = Table(
    "nodes",
    metadata,
    Column("name", String(64), primary_key=True),
    Column("first_seen_at", DateTime(timezone=True), nullable=False),
    Column("last_report_at", DateTime(timezone=True), nullable=True),
    Column("last_report_id", String(36), nullable=True),
    # sent_at (capped at receipt) of the newest report applied to the state: older ones only
    # go to history, so state moves forward only
    Column("last_sent_at", DateTime(timezone=True), nullable=True),
    # non-ok findings of the latest full report plus event findings since (JSON list)
    Column("open_findings", JSON, nullable=False, default=list),
    Column("worst_severity", String(16), nullable=False, default="ok"),
    Column("consecutive_clean", Integer, nullable=False, default=0),
    Column("verdict", String(16), nullable=False, default="unknown"),
    Column("babysitter_drained", Boolean, nullable=False, default=False),
    Column("drain_reason", Text, nullable=True),
    Column("drained_at", DateTime(timezone=True), nullable=True),
    Column("slurm_state", String(64), nullable=True),
    Column("slurm_reason", Text, nullable=True),
    Column("metrics", JSON, nullable=True),
    # the node's current drain episode: the newest action id when babysitter last drained it
    # (policy, held, switch or NVLink domain incident); its validations are the `validate`
    # actions after it (controller/db/episodes.py). Null: never drained by babysitter
    Column("drain_episode", BigInteger, nullable=True),
)

reports = Table(
    "reports",
    metadata,
    Column(
        "id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True
    ),
    Column("report_id", String(36), nullable=False, unique=True),
    Column("node", String(64), nullable=False),
    Column("kind", String(16), nullable=False, default="full"),
    Column("sent_at", DateTime(timezone=True), nullable=False),
    Column("received_at", DateTime(timezone=True), nullable=False),
    Column("n_findings", Integer, nullable=False),
    Column("worst_severity", String(16), nullable=False),
    Column("metrics", JSON, nullable=True),
    Index("ix_reports_node_received", "node", "received_at"),
    # retention: the oldest reports first, in small batches (controller/db/retention.py)
    Index("ix_reports_received", "received_at"),
    # retention thins clean reports first: per severity, oldest first
    Index("ix_reports_worst_received", "worst_severity", "received_at"),
)

findings = Table(
    "findings",
    metadata,
    Column(
        "id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True
    ),
    Column(
        "report_id", String(36), ForeignKey("reports.report_id", ondelete="CASCADE"), nullable=False
    ),
    Column("node", String(64), nullable=False),
    Column("check", String(64), nullable=False),
    Column("component", String(128), nullable=False),
    Column("severity", String(16), nullable=False),
    Column("code", String(128), nullable=False),
    Column("message", Text, nullable=False),
    Column("action", String(16), nullable=False),
    Column("observed_at", DateTime(timezone=True), nullable=False),
    Column("details", JSON, nullable=True),
    Index("ix_findings_node_observed", "node", "observed_at"),
    Index("ix_findings_report", "report_id"),
    # the policy's hot query each tick: critical findings of the last 24 h
    Index("ix_findings_severity_observed", "severity", "observed_at"),
)

actions = Table(
    "actions",
    metadata,
    Column(
        "id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True
    ),
    Column("kind", String(32), nullable=False),  # drain resume requeue hold alert guard ...
    Column("node", String(64), nullable=True),
    Column("job_id", BigInteger, nullable=True),
    Column("reason", Text, nullable=True),
    Column("rule", Text, nullable=True),  # which policy rule fired
    Column("requested_by", String(64), nullable=False),  # policy | admin | agent
    Column("status", String(16), nullable=False),  # pending done failed skipped
    Column("outcome", Text, nullable=True),
    Column("dry_run", Boolean, nullable=False, default=False),
    Column("attempts", Integer, nullable=False, default=0),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("done_at", DateTime(timezone=True), nullable=True),
    Column("next_attempt_at", DateTime(timezone=True), nullable=True),
    Index("ix_actions_status", "status"),
    Index("ix_actions_node_kind", "node", "kind"),
    # each tick's validation history (controller/db/episodes.py): the validate rows only
    Index("ix_actions_kind_node", "kind", "node"),
)

alerts = Table(
    "alerts",
    metadata,
    Column("key", String(255), primary_key=True),  # node|condition
    Column("node", String(64), nullable=True),
    Column("condition", String(128), nullable=False),
    Column("severity", String(16), nullable=False),
    Column("state", String(16), nullable=False),  # firing | resolved
    Column("summary", Text, nullable=False),
    Column("started_at", DateTime(timezone=True), nullable=False),
    Column("last_sent_at", DateTime(timezone=True), nullable=True),
    Column("resolved_at", DateTime(timezone=True), nullable=True),
    Column("sink_results", JSON, nullable=True),
)

jobs = Table(
    "jobs",
    metadata,
    Column("job_id", BigInteger, primary_key=True),
    Column("name", String(1024), nullable=True),  # Slurm allows 1024
    Column("user", String(64), nullable=True),
    Column("nodes", JSON, nullable=False, default=list),
    Column("state", String(64), nullable=True),
    Column("babysit", JSON, nullable=False),  # parsed --babysit arguments
    Column("restart_count", Integer, nullable=False, default=0),
    Column("requeues", Integer, nullable=False, default=0),  # done by babysitter
    Column("resume_point", Text, nullable=True),
    Column("history", JSON, nullable=False, default=list),
    Column("first_seen_at", DateTime(timezone=True), nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False),
)


def new_job_columns(columns: frozenset[str], at: datetime) -> dict[str, Any]:
    """What a new jobs row gets besides the columns written: when it was first seen, and an
    empty babysit spec unless one is written (the column has no default)."""
    return {"first_seen_at": at} | ({} if "babysit" in columns else {"babysit": {}})


# The lemon ledger: one row per rung babysitter climbed (or decided not to) for a node's fault,
# with the GPU it concerned (UUID and serial travel with the hardware: a node renamed keeps its
# history through them). Rows of the node's current episode are `open`; an admin's clear sets
# cleared_at and the rows stop counting towards a lemon (controller/loop/read/ledger.py).
remediations = Table(
    "remediations",
    metadata,
    Column(
        "id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True
    ),
    Column("node", String(64), nullable=False),
    Column("rung", String(16), nullable=False),  # reset_gpu reboot inspect rma
    Column("fault_class", String(128), nullable=False),  # finding code or xid.<N>
    Column("fault", Text, nullable=False),  # what was wrong, as the drain said it
    Column("gpu_uuid", String(96), nullable=True),
    Column("gpu_serial", String(64), nullable=True),
    # waiting rebooting validating passed failed timed_out inspect lemon dry_run cleared
    Column("state", String(16), nullable=False),
    Column("open", Boolean, nullable=False, default=True),
    Column("requested_by", String(64), nullable=False),  # policy | admin:<who>
    Column("outcome", Text, nullable=True),  # the last thing that happened, for people
    Column("evidence", JSON, nullable=False, default=dict),  # boot ids/times, job, timings
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False),
    Column("done_at", DateTime(timezone=True), nullable=True),
    Column("cleared_at", DateTime(timezone=True), nullable=True),
    Index("ix_remediations_node_created", "node", "created_at"),
    Index("ix_remediations_open", "open"),
    Index("ix_remediations_gpu", "gpu_uuid"),
)

# RMA evidence archives (controller/loop/heal/rma.py orders, controller/api/api_rma.py stores)
rma_archives = Table(
    "rma_archives",
    metadata,
    Column(
        "id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True
    ),
    Column("node", String(64), nullable=False),
    Column("ledger_id", BigInteger, nullable=True),  # the ledger row that asked for it
    Column("trigger", Text, nullable=False),  # lemon: ... | reboot failed: ...
    Column("order_id", String(36), nullable=False, unique=True),
    Column("action_id", BigInteger, nullable=True),  # its rma_evidence action
    Column("state", String(16), nullable=False),  # ordered collected failed
    Column("outcome", Text, nullable=True),  # what was collected, or why nothing was
    Column("path", Text, nullable=True),  # the archive's file name under [rma] archive_dir
    Column("size", BigInteger, nullable=True),
    Column("sha256", String(64), nullable=True),
    Column("alerted", Boolean, nullable=False, default=False),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False),
    Index("ix_rma_archives_node", "node", "created_at"),
)

kv = Table(
    "kv",
    metadata,
    Column("key", String(128), primary_key=True),
    Column("value", JSON, nullable=True),
    Column("updated_at", DateTime(timezone=True), nullable=False),
)

# Who did what to which node, when, on what evidence and with what result (controller/db/audit.py).
# Written when an action settles (and when an admin asks for one); kept audit_retention_days.
audit_log = Table(
    "audit_log",
    metadata,
    Column(
        "id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True
    ),
    Column("at", DateTime(timezone=True), nullable=False),
    Column("actor", String(128), nullable=False),  # policy | admin | admin (who) | maintenance
    Column("kind", String(32), nullable=False),  # drain resume requeue guard maintenance_start ...
    Column("node", String(64), nullable=True),
    Column("job_id", BigInteger, nullable=True),
    Column("action_id", BigInteger, nullable=True),
    Column("rule", Text, nullable=True),
    Column("reason", Text, nullable=True),
    Column("result", String(16), nullable=False),  # requested done failed skipped dry_run
    Column("outcome", Text, nullable=True),
    Column("evidence", JSON, nullable=False, default=list),  # the findings behind it
    Index("ix_audit_at", "at"),
    Index("ix_audit_node_at", "node", "at"),
)

# Maintenance windows (loop/admit/maintenance.py): nodes babysitter neither drains nor pages
# until `ends_at` or an admin ends the window early.
maintenance_windows = Table(
    "maintenance_windows",
    metadata,
    Column(
        "id", BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True
    ),
    Column("nodes", JSON, nullable=False),  # expanded node names
    Column("hostlist", Text, nullable=False),  # as the admin wrote it
    Column("reason", Text, nullable=False),
    Column("created_by", String(128), nullable=False),
    Column("starts_at", DateTime(timezone=True), nullable=False),
    Column("ends_at", DateTime(timezone=True), nullable=False),
    Column("ended_at", DateTime(timezone=True), nullable=True),  # null while open
    Column("reservation", String(128), nullable=True),  # Slurm reservation name
    Column("silence_id", String(64), nullable=True),  # Alertmanager silence id
    Column("state", String(16), nullable=False),  # active | ended
    Column("note", Text, nullable=True),  # what could not be done (reservation, silence)
    Index("ix_maintenance_state", "state"),
)

# The periodic SDC test's schedule (loop/sdc/schedule.py), one row per node: the order
# in flight (its Slurm hold and id, which the ingest hands the node's agent), the last test
# that ran, and why the node is not being tested when it is due.
sdc_schedule = Table(
    "sdc_schedule",
    metadata,
    Column("node", String(64), primary_key=True),
    Column("hold", String(64), nullable=True),  # the Slurm reservation while under test
    Column("order_id", String(36), nullable=True),
    Column("ordered_at", DateTime(timezone=True), nullable=True),
    Column("last_attempt_at", DateTime(timezone=True), nullable=True),
    Column("last_run_at", DateTime(timezone=True), nullable=True),
    Column("last_code", String(64), nullable=True),
    Column("last_library", String(64), nullable=True),
    Column("last_message", Text, nullable=True),
    Column("last_gflops", JSON, nullable=True),
    Column("waiting", Text, nullable=True),
    Column("updated_at", DateTime(timezone=True), nullable=False),
)
