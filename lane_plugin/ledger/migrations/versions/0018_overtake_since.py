"""rule 12 learns Q from a day of arrivals before it binds (lane.overtake_since)

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-04 21:40:00

- lane.overtake_since: when rule 12 was turned on on the lane (null: off). Until the refit has learned ``Q`` from a
  day of arrivals since, the keys are unbounded (lane_plugin.ledger.overtake, "The learning day").

Existing rows: a lane with the rule on counts as on since a day before the upgrade: it learns ``Q`` at its next
refit, as before.
"""

import time

import sqlalchemy as sa
from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("lane") as batch_op:
        batch_op.add_column(sa.Column("overtake_since", sa.Float(), nullable=True))
    since = time.time() - 86_400.0  # (lane_plugin.ledger.overtake.LEARN_SECONDS, as the rule stood at 0018)
    op.execute(sa.text("update lane set overtake_since = :s where overtake_slack is not null").bindparams(s=since))


def downgrade() -> None:
    with op.batch_alter_table("lane") as batch_op:
        batch_op.drop_column("overtake_since")
