"""nodes.drain_episode, ix_actions_kind_node: validation per drain episode, in the database

Every babysitter drain (policy, held, switch incident, NVLink domain incident) starts a new
validation history for the node: the validations after the action id kept here
(controller/db/episodes.py). Existing nodes start at their newest babysitter drain.

Revision ID: 0008_drain_episode
Revises: 0007_rma_archives
"""

import sqlalchemy as sa
from alembic import op

revision = "0008_drain_episode"
down_revision = "0007_rma_archives"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("nodes") as b:
        b.add_column(sa.Column("drain_episode", sa.BigInteger(), nullable=True))
    # the tick reads every node's validations: the validate rows only, not the whole table
    op.create_index("ix_actions_kind_node", "actions", ["kind", "node"], unique=False)
    # the episode each node is in now: its newest drain done by the policy or an incident
    # (an admin's drain and the validation's own re-drain start none)
    op.execute(
        "UPDATE nodes SET drain_episode = (SELECT max(a.id) FROM actions a"
        " WHERE a.node = nodes.name AND a.kind = 'drain' AND a.status = 'done'"
        " AND a.requested_by IN ('policy', 'fabric'))"
    )


def downgrade() -> None:
    op.drop_index("ix_actions_kind_node", table_name="actions")
    with op.batch_alter_table("nodes") as b:
        b.drop_column("drain_episode")
