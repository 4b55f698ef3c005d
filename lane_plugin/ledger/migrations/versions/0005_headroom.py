"""headroom for the spread of what is in flight

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-29 22:30:00

- job.est_var: the variance of ``actual - est`` its estimator knew at intake (a learned
  estimator's fitted spread of the stage; 0: unknown, no headroom);
- lane.reserved_var: the sum of ``est_var`` of the leased jobs, kept beside ``reserved`` by every
  writer that moves it, so admission reads the spread in flight from the lane row alone;
- lane.headroom_sigmas: admission keeps ``headroom_sigmas * sqrt(reserved_var + est_var)`` of the
  ceiling free (policy.LanePolicy.headroom).

Existing jobs and lanes: est_var 0, reserved_var 0 (nothing in flight has a known spread).
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("lane", schema=None) as b:
        b.add_column(sa.Column("headroom_sigmas", sa.Float(), nullable=False, server_default="2.0"))
        b.add_column(sa.Column("reserved_var", sa.BigInteger(), nullable=False, server_default="0"))
        b.create_check_constraint("ck_lane_headroom", "reserved_var >= 0 and headroom_sigmas >= 0")
    with op.batch_alter_table("job", schema=None) as b:
        b.add_column(sa.Column("est_var", sa.BigInteger(), nullable=False, server_default="0"))
        b.create_check_constraint("ck_job_est_var", "est_var >= 0")


def downgrade() -> None:
    with op.batch_alter_table("job", schema=None) as b:
        b.drop_constraint("ck_job_est_var", type_="check")
        b.drop_column("est_var")
    with op.batch_alter_table("lane", schema=None) as b:
        b.drop_constraint("ck_lane_headroom", type_="check")
        b.drop_column("reserved_var")
        b.drop_column("headroom_sigmas")
