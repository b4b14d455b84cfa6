"""the periodic SDC test's schedule: one row per node

The controller orders a short SDC test on idle nodes under a Slurm hold (controller/
sdc_schedule.py); this table keeps the order in flight, the last test that ran (when, with
which backend, the result) and why a due node is not being tested.

Revision ID: 0006_sdc_schedule
Revises: 0005_remediation
"""

import sqlalchemy as sa
from alembic import op

revision = "0006_sdc_schedule"
down_revision = "0005_remediation"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "sdc_schedule",
        sa.Column("node", sa.String(64), primary_key=True),
        sa.Column("hold", sa.String(64), nullable=True),
        sa.Column("order_id", sa.String(36), nullable=True),
        sa.Column("ordered_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_attempt_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_run_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_code", sa.String(64), nullable=True),
        sa.Column("last_library", sa.String(64), nullable=True),
        sa.Column("last_message", sa.Text(), nullable=True),
        sa.Column("last_gflops", sa.JSON(), nullable=True),
        sa.Column("waiting", sa.Text(), nullable=True),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("sdc_schedule")
