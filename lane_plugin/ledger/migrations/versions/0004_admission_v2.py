"""admission v2: two currencies, a sliding rate window, the finishing reserve, one priority

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-02 10:00:00

- job.rate_cost (what the provider's rate limiter counts; existing jobs: their estimate),
  job.prio (the continuous priority) and job.finishing, indexed as (lane, state, finishing, prio)
  in place of the smallest-first and aging indexes;
- lane.rate_basis, lane.finishing (sum of the reserves of runs under way), lane.profile_at;
- lane_run gains the reserve of a run under way; existing runs count as finished;
- rate_charge: one row per admission while it is in the sliding window (existing lanes start with an
  empty window); run_profile: what runs needed after each stage.
"""

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("lane", schema=None) as b:
        b.add_column(
            sa.Column(
                "rate_basis", sqlmodel.sql.sqltypes.AutoString(length=16), nullable=False, server_default="request"
            )
        )
        b.add_column(sa.Column("finishing", sa.BigInteger(), nullable=False, server_default="0"))
        b.add_column(sa.Column("profile_at", sa.Float(), nullable=False, server_default="0"))
        b.create_check_constraint("ck_lane_rate_reserve", "rate_basis in ('request', 'actual') and finishing >= 0")
    with op.batch_alter_table("job", schema=None) as b:
        b.add_column(sa.Column("rate_cost", sa.BigInteger(), nullable=True))
        b.add_column(sa.Column("prio", sa.Float(), nullable=False, server_default="0"))
        b.add_column(sa.Column("finishing", sa.Boolean(), nullable=False, server_default=sa.false()))
        b.create_check_constraint("ck_job_rate_cost", "rate_cost is null or rate_cost > 0")
    with op.batch_alter_table("lane_run", schema=None) as b:
        b.add_column(sa.Column("stage", sqlmodel.sql.sqltypes.AutoString(), nullable=True))
        b.add_column(sa.Column("committed", sa.BigInteger(), nullable=False, server_default="0"))
        b.add_column(sa.Column("remaining", sa.BigInteger(), nullable=False, server_default="0"))
        b.add_column(sa.Column("last_at", sa.Float(), nullable=False, server_default="0"))
        b.add_column(sa.Column("expires_at", sa.Float(), nullable=True))
    # Existing rows: the estimate is what the rate limiter was charged; the order is the new
    # priority under each lane's settings; a waiting job whose run started is finishing.
    op.execute("update job set rate_cost = est")
    op.execute(
        "update job set prio = wait_since + est * coalesce((select l.max_wait_seconds / (case when l.ceiling < "
        "l.burst_tokens then l.ceiling else l.burst_tokens end) from lane l where l.name = job.lane), 0)"
    )
    op.execute(
        "update job set finishing = true where run_key is not null and exists (select 1 from lane_run r "
        "where r.lane = job.lane and r.run_key = job.run_key)"
    )
    op.execute("update lane_run set last_at = started_at")
    op.execute("update lane set window_used = 0, window_start = 0")
    with op.batch_alter_table("job", schema=None) as b:
        b.drop_index("ix_job_admission")
        b.drop_index("ix_job_aging")
        b.create_index("ix_job_queue", ["lane", "state", "finishing", "prio"], unique=False)
    with op.batch_alter_table("lane_run", schema=None) as b:
        b.create_index("ix_lane_run_expires", ["lane", "expires_at"], unique=False)
        b.create_index("ix_lane_run_last", ["lane", "last_at"], unique=False)
    op.create_table(
        "rate_charge",
        sa.Column("job_id", sqlmodel.sql.sqltypes.AutoString(length=64), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("lane", sqlmodel.sql.sqltypes.AutoString(length=64), nullable=False),
        sa.Column("at", sa.Float(), nullable=False),
        sa.Column("cost", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("job_id", "attempt"),
    )
    with op.batch_alter_table("rate_charge", schema=None) as b:
        b.create_index("ix_rate_charge_lane_at", ["lane", "at"], unique=False)
    op.create_table(
        "run_profile",
        sa.Column("lane", sqlmodel.sql.sqltypes.AutoString(length=64), nullable=False),
        sa.Column("stage", sqlmodel.sql.sqltypes.AutoString(), nullable=False),
        sa.Column("after_tokens", sa.BigInteger(), nullable=False),
        sa.Column("hold_seconds", sa.Float(), nullable=False),
        sa.Column("runs", sa.Integer(), nullable=False),
        sa.Column("fitted_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("lane", "stage"),
    )


def downgrade() -> None:
    op.drop_table("run_profile")
    with op.batch_alter_table("rate_charge", schema=None) as b:
        b.drop_index("ix_rate_charge_lane_at")
    op.drop_table("rate_charge")
    with op.batch_alter_table("lane_run", schema=None) as b:
        b.drop_index("ix_lane_run_last")
        b.drop_index("ix_lane_run_expires")
        for col in ("expires_at", "last_at", "remaining", "committed", "stage"):
            b.drop_column(col)
    with op.batch_alter_table("job", schema=None) as b:
        b.drop_index("ix_job_queue")
        b.create_index("ix_job_admission", ["lane", "state", "est", "wait_since"], unique=False)
        b.create_index("ix_job_aging", ["lane", "state", "wait_since"], unique=False)
        b.drop_constraint("ck_job_rate_cost", type_="check")
        for col in ("finishing", "prio", "rate_cost"):
            b.drop_column(col)
    with op.batch_alter_table("lane", schema=None) as b:
        b.drop_constraint("ck_lane_rate_reserve", type_="check")
        for col in ("profile_at", "finishing", "rate_basis"):
            b.drop_column(col)
