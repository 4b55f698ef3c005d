"""size classes in the admission order

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-29 23:30:00

- lane.size_boundary: the lane's size-class boundary (policy.size_class_boundary: the 60th
  percentile of its last 500 estimates), refit with the finishing-reserve profile; null until
  learned, and a null boundary is the one continuous priority of before;
- ix_job_lane_created (lane, created_at): the refit reads the lane's latest estimates from its head.

Existing lanes: no boundary (waiting jobs keep their place until the first refit places new ones).
"""

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("lane", schema=None) as b:
        b.add_column(sa.Column("size_boundary", sa.BigInteger(), nullable=True))
    op.create_index("ix_job_lane_created", "job", ["lane", "created_at"])


def downgrade() -> None:
    op.drop_index("ix_job_lane_created", table_name="job")
    with op.batch_alter_table("lane", schema=None) as b:
        b.drop_column("size_boundary")
