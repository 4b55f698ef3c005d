"""limits as providers state them: lane_limit, limit_charge, a provider's pause, the job's units

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-03 03:50:00

- lane_limit (lane, unit, amount, window_seconds, used, window_start): a lane's sliding windows over
  requests, input_tokens and output_tokens (lane_plugin.policy.limits), each with its counter.
- limit_charge (job_id, attempt, unit, lane, at, cost, sent): what one admission counted against one
  limit, as rate_charge is for the tokens window (pruned as its window slides).
- lane.limit_spec: those limits as text ("requests=500/60s output_tokens=8000/60s"): the lane row says
  which it has, so a lane without any reads no lane_limit row at admission.
- lane.paused_until / lane.paused_reason: a provider's 429 closed the lane until then.
- job.rate_input / job.rate_output: the job's units for the input/output limits (null: unknown);
  job.rate_limited: the provider 429s its attempts met.

Existing lanes: their burst window (burst_tokens / window_seconds) is their tokens limit, as it was;
they get no other limit. Existing jobs: no split (their rate cost counts against both token limits).
"""

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "lane_limit",
        sa.Column("lane", sqlmodel.sql.sqltypes.AutoString(length=64), nullable=False),
        sa.Column("unit", sqlmodel.sql.sqltypes.AutoString(length=16), nullable=False),
        sa.Column("amount", sa.BigInteger(), nullable=False),
        sa.Column("window_seconds", sa.Float(), nullable=False),
        sa.Column("used", sa.BigInteger(), nullable=False),
        sa.Column("window_start", sa.Float(), nullable=False),
        sa.CheckConstraint("amount > 0 and window_seconds > 0 and used >= 0", name="ck_lane_limit"),
        sa.PrimaryKeyConstraint("lane", "unit"),
    )
    op.create_table(
        "limit_charge",
        sa.Column("job_id", sqlmodel.sql.sqltypes.AutoString(length=64), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("unit", sqlmodel.sql.sqltypes.AutoString(length=16), nullable=False),
        sa.Column("lane", sqlmodel.sql.sqltypes.AutoString(length=64), nullable=False),
        sa.Column("at", sa.Float(), nullable=False),
        sa.Column("cost", sa.BigInteger(), nullable=False),
        sa.Column("sent", sa.Boolean(), server_default=sa.true(), nullable=False),
        sa.PrimaryKeyConstraint("job_id", "attempt", "unit"),
    )
    op.create_index("ix_limit_charge_lane_unit_at", "limit_charge", ["lane", "unit", "at"], unique=False)
    with op.batch_alter_table("lane") as batch_op:
        batch_op.add_column(sa.Column("paused_until", sa.Float(), nullable=True))
        batch_op.add_column(sa.Column("paused_reason", sqlmodel.sql.sqltypes.AutoString(), nullable=True))
        batch_op.add_column(sa.Column("limit_spec", sqlmodel.sql.sqltypes.AutoString(), nullable=True))
    with op.batch_alter_table("job") as batch_op:
        batch_op.add_column(sa.Column("rate_input", sa.BigInteger(), nullable=True))
        batch_op.add_column(sa.Column("rate_output", sa.BigInteger(), nullable=True))
        batch_op.add_column(sa.Column("rate_limited", sa.Integer(), server_default="0", nullable=False))


def downgrade() -> None:
    with op.batch_alter_table("job") as batch_op:
        batch_op.drop_column("rate_limited")
        batch_op.drop_column("rate_output")
        batch_op.drop_column("rate_input")
    with op.batch_alter_table("lane") as batch_op:
        batch_op.drop_column("limit_spec")
        batch_op.drop_column("paused_reason")
        batch_op.drop_column("paused_until")
    op.drop_index("ix_limit_charge_lane_unit_at", table_name="limit_charge")
    op.drop_table("limit_charge")
    op.drop_table("lane_limit")
