"""indexes for retention and the policy's hot queries

The policy reads the last 24 h of critical findings every tick and the retention thread
deletes the oldest reports in small batches; without these both scan whole tables that grow
by ~2,000 reports/s on a 10,000-node cluster.

Revision ID: 0002_slurm10k
Revises: 0002_ingress
"""

from alembic import op

revision = "0002_slurm10k"
down_revision = "0002_ingress"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_reports_received", "reports", ["received_at"], unique=False)
    op.create_index(
        "ix_reports_worst_received", "reports", ["worst_severity", "received_at"], unique=False
    )
    op.create_index(
        "ix_findings_severity_observed", "findings", ["severity", "observed_at"], unique=False
    )


def downgrade() -> None:
    op.drop_index("ix_findings_severity_observed", table_name="findings")
    op.drop_index("ix_reports_worst_received", table_name="reports")
    op.drop_index("ix_reports_received", table_name="reports")
