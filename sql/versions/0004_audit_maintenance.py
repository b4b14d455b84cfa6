"""audit log and maintenance windows (the on-call cockpit)

Every action babysitter or an admin takes is kept with actor, time, evidence and result
(audit_log); maintenance windows keep nodes from being drained or paged until they end.

Revision ID: 0004_cockpit
Revises: 0002_slurm10k
"""

import sqlalchemy as sa
from alembic import op

revision = "0004_cockpit"
down_revision = "0002_slurm10k"
branch_labels = None
depends_on = None


def _id() -> sa.Column:
    return sa.Column(
        "id",
        sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
        primary_key=True,
        autoincrement=True,
    )


def upgrade() -> None:
    op.create_table(
        "audit_log",
        _id(),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("actor", sa.String(length=128), nullable=False),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("node", sa.String(length=64), nullable=True),
        sa.Column("job_id", sa.BigInteger(), nullable=True),
        sa.Column("action_id", sa.BigInteger(), nullable=True),
        sa.Column("rule", sa.Text(), nullable=True),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("result", sa.String(length=16), nullable=False),
        sa.Column("outcome", sa.Text(), nullable=True),
        sa.Column("evidence", sa.JSON(), nullable=False),
    )
    op.create_index("ix_audit_at", "audit_log", ["at"], unique=False)
    op.create_index("ix_audit_node_at", "audit_log", ["node", "at"], unique=False)
    op.create_table(
        "maintenance_windows",
        _id(),
        sa.Column("nodes", sa.JSON(), nullable=False),
        sa.Column("hostlist", sa.Text(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("created_by", sa.String(length=128), nullable=False),
        sa.Column("starts_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("ends_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("ended_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("reservation", sa.String(length=128), nullable=True),
        sa.Column("silence_id", sa.String(length=64), nullable=True),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("note", sa.Text(), nullable=True),
    )
    op.create_index("ix_maintenance_state", "maintenance_windows", ["state"], unique=False)


def downgrade() -> None:
    op.drop_index("ix_maintenance_state", table_name="maintenance_windows")
    op.drop_table("maintenance_windows")
    op.drop_index("ix_audit_node_at", table_name="audit_log")
    op.drop_index("ix_audit_at", table_name="audit_log")
    op.drop_table("audit_log")
