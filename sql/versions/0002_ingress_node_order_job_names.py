"""nodes.last_sent_at (node state moves forward only); jobs.name as wide as Slurm's (1024)

Revision ID: 0002_ingress
Revises: 0001
"""

import sqlalchemy as sa
from alembic import op

revision = "0002_ingress"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("nodes") as b:
        b.add_column(sa.Column("last_sent_at", sa.DateTime(timezone=True), nullable=True))
    with op.batch_alter_table("jobs") as b:
        b.alter_column("name", existing_type=sa.String(length=255), type_=sa.String(length=1024))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as b:
        b.alter_column("name", existing_type=sa.String(length=1024), type_=sa.String(length=255))
    with op.batch_alter_table("nodes") as b:
        b.drop_column("last_sent_at")
