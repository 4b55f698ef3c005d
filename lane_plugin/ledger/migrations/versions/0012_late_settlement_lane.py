"""a late settlement is billed to the lane its attempt ran in: lane_move

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-30 07:10:00

- lane_move (job_id, leased_upto, lane, moved_at): a job that left a lane for its fallback after
  attempts of it were leased there. A late settlement of an attempt up to leased_upto (and past any
  earlier move's) is billed to that lane, where its provider billed it, not to the lane the job is in
  now. Written by the move itself (one row per move of a once-leased job), nothing at admission.

Existing jobs: a job whose attempt still has a rate charge in a lane other than its own left that lane
after leasing that attempt, and gets its row (the latest such attempt; moved_at: its charge's time). A
move whose charges already left the window is not known: its late settlements bill the job's lane, as
before.
"""

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "lane_move",
        sa.Column("job_id", sqlmodel.sql.sqltypes.AutoString(length=64), nullable=False),
        sa.Column("leased_upto", sa.Integer(), nullable=False),
        sa.Column("lane", sqlmodel.sql.sqltypes.AutoString(length=64), nullable=False),
        sa.Column("moved_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("job_id", "leased_upto"),
    )
    op.execute(
        "insert into lane_move (job_id, leased_upto, lane, moved_at) "
        "select c.job_id, max(c.attempt), c.lane, max(c.at) from rate_charge c join job j on j.id = c.job_id "
        "where c.lane != j.lane group by c.job_id, c.lane"
    )


def downgrade() -> None:
    op.drop_table("lane_move")
