"""the drift allowance of the ceiling rule

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-30 02:30:00

- lane.drift: sum(actual) / sum(est) of the lane's latest settlements when above 1 (else 1):
  admission charges what is in flight and the job at their drift-corrected size;
- lane.drift_spread: the 90th percentile of what a settlement ran past its drift-corrected size,
  kept free per job in flight;
- lane.drift_overrun: the most one ran past it, kept free once (policy.fit_drift). All three are
  refit with the finishing-reserve profile, from the head of ix_settlement_lane_at.

Existing lanes: drift 1.0, spread 0, overrun 0 (the rule of before) until their next refit.
"""

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("lane", schema=None) as b:
        b.add_column(sa.Column("drift", sa.Float(), nullable=False, server_default="1.0"))
        b.add_column(sa.Column("drift_overrun", sa.BigInteger(), nullable=False, server_default="0"))
        b.add_column(sa.Column("drift_spread", sa.BigInteger(), nullable=False, server_default="0"))
        b.create_check_constraint("ck_lane_drift", "drift >= 1 and drift_overrun >= 0 and drift_spread >= 0")


def downgrade() -> None:
    with op.batch_alter_table("lane", schema=None) as b:
        b.drop_constraint("ck_lane_drift", type_="check")
        b.drop_column("drift_spread")
        b.drop_column("drift_overrun")
        b.drop_column("drift")
