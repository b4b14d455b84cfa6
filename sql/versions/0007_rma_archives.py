"""RMA evidence archives: one row per archive the controller ordered from a node's agent

Revision ID: 0007_rma_archives
Revises: 0006_sdc_schedule
"""

import sqlalchemy as sa
from alembic import op

revision = "0007_rma_archives"
down_revision = "0006_sdc_schedule"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "rma_archives",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True),
        sa.Column("node", sa.String(64), nullable=False),
        sa.Column("ledger_id", sa.BigInteger(), nullable=True),
        sa.Column("trigger", sa.Text(), nullable=False),
        sa.Column("order_id", sa.String(36), nullable=False, unique=True),
        sa.Column("action_id", sa.BigInteger(), nullable=True),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("outcome", sa.Text(), nullable=True),
        sa.Column("path", sa.Text(), nullable=True),
        sa.Column("size", sa.BigInteger(), nullable=True),
        sa.Column("sha256", sa.String(64), nullable=True),
        sa.Column("alerted", sa.Boolean(), nullable=False, server_default=sa.false()),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_rma_archives_node", "rma_archives", ["node", "created_at"])


def downgrade() -> None:
    op.drop_index("ix_rma_archives_node", "rma_archives")
    op.drop_table("rma_archives")
