"""a rate charge is pending until its lease is picked up

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-30 07:00:00

- rate_charge.sent: false while the lease is handed to a waiter that has not picked it up yet (its
  request has not gone out, but will): the window's slide never prunes such a charge, the pick-up
  (rates.stamp, waiters.rows_sent) moves it to the pick-up and marks it sent, and a lease that ends
  without a pick-up (reaped, voided) drops it. So a late pick-up can no longer send a request the
  window stopped counting.

Existing charges: sent (counted from their grant, as before).
"""

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("rate_charge", schema=None) as b:
        b.add_column(sa.Column("sent", sa.Boolean(), nullable=False, server_default=sa.true()))


def downgrade() -> None:
    with op.batch_alter_table("rate_charge", schema=None) as b:
        b.drop_column("sent")
