"""a provider's pause reopens with one probe for the whole lane: lane.probe_until

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-03 11:40:00

- lane.probe_until: after a provider's pause ended (``paused_until`` in the past, not yet cleared), the
  one gate of any process that claimed the probe sends alone until its answer, or until then (a probe that
  hangs does not stall the lane). A probe's success clears ``paused_until`` (the lane is open); a 429 writes
  a new pause and clears the claim.

Existing lanes: no probe out (null).
"""

import sqlalchemy as sa
from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("lane") as batch_op:
        batch_op.add_column(sa.Column("probe_until", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("lane") as batch_op:
        batch_op.drop_column("probe_until")
