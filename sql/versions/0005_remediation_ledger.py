"""the lemon ledger: remediations per node and GPU

Revision ID: 0005_remediation
Revises: 0004_cockpit
"""

import sqlalchemy as sa
from alembic import op

revision = "0005_remediation"
down_revision = "0004_cockpit"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "remediations",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("node", sa.String(length=64), nullable=False),
        sa.Column("rung", sa.String(length=16), nullable=False),
        sa.Column("fault_class", sa.String(length=128), nullable=False),
        sa.Column("fault", sa.Text(), nullable=False),
        sa.Column("gpu_uuid", sa.String(length=96), nullable=True),
        sa.Column("gpu_serial", sa.String(length=64), nullable=True),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("open", sa.Boolean(), nullable=False),
        sa.Column("requested_by", sa.String(length=64), nullable=False),
        sa.Column("outcome", sa.Text(), nullable=True),
        sa.Column("evidence", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("done_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("cleared_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_remediations_node_created", "remediations", ["node", "created_at"])
    op.create_index("ix_remediations_open", "remediations", ["open"])
    op.create_index("ix_remediations_gpu", "remediations", ["gpu_uuid"])


def downgrade() -> None:
    op.drop_index("ix_remediations_gpu", table_name="remediations")
    op.drop_index("ix_remediations_open", table_name="remediations")
    op.drop_index("ix_remediations_node_created", table_name="remediations")
    op.drop_table("remediations")
