"""initial ledger schema

Revision ID: 0001
Revises:
Create Date: 2026-11-29 09:07:35.882173
"""

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "job",
        sa.Column("id", sqlmodel.sql.sqltypes.AutoString(length=64), nullable=False),
        sa.Column("lane", sqlmodel.sql.sqltypes.AutoString(length=64), nullable=False),
        sa.Column("stage", sqlmodel.sql.sqltypes.AutoString(), nullable=False),
        sa.Column("est", sa.BigInteger(), nullable=False),
        sa.Column("est_version", sqlmodel.sql.sqltypes.AutoString(), nullable=True),
        sa.Column("actual", sa.BigInteger(), nullable=False),
        sa.Column("state", sqlmodel.sql.sqltypes.AutoString(length=16), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("lease_attempt", sa.Integer(), nullable=False),
        sa.Column("lease_until", sa.Float(), nullable=False),
        sa.Column("lease_token", sqlmodel.sql.sqltypes.AutoString(length=64), nullable=True),
        sa.Column("deadline", sa.Float(), nullable=True),
        sa.Column("run_key", sqlmodel.sql.sqltypes.AutoString(), nullable=True),
        sa.Column("key", sqlmodel.sql.sqltypes.AutoString(), nullable=True),
        sa.Column("fallback", sqlmodel.sql.sqltypes.AutoString(length=64), nullable=True),
        sa.Column("reason", sqlmodel.sql.sqltypes.AutoString(), nullable=True),
        sa.Column("created_at", sa.Float(), nullable=False),
        sa.Column("wait_since", sa.Float(), nullable=False),
        sa.Column("admitted_at", sa.Float(), nullable=True),
        sa.Column("finished_at", sa.Float(), nullable=True),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("key"),
        sa.CheckConstraint("est > 0 and actual >= 0 and attempt >= 1", name="ck_job_numbers"),
        sa.CheckConstraint(
            "state in ('new', 'leased', 'done', 'failed', 'parked')",
            name="ck_job_state",
        ),
    )
    with op.batch_alter_table("job", schema=None) as batch_op:
        batch_op.create_index("ix_job_admission", ["lane", "state", "est", "wait_since"], unique=False)
        batch_op.create_index("ix_job_aging", ["lane", "state", "wait_since"], unique=False)
        batch_op.create_index("ix_job_deadline", ["state", "deadline"], unique=False)
        batch_op.create_index("ix_job_lease", ["state", "lease_until"], unique=False)
        batch_op.create_index("ix_job_run", ["lane", "run_key"], unique=False)

    op.create_table(
        "lane",
        sa.Column("name", sqlmodel.sql.sqltypes.AutoString(length=64), nullable=False),
        sa.Column("allowance", sa.BigInteger(), nullable=False),
        sa.Column("ceiling", sa.BigInteger(), nullable=False),
        sa.Column("start_fraction", sa.Float(), nullable=False),
        sa.Column("burst_tokens", sa.BigInteger(), nullable=False),
        sa.Column("window_seconds", sa.Float(), nullable=False),
        sa.Column("max_leased", sa.Integer(), nullable=False),
        sa.Column("lease_seconds", sa.Float(), nullable=False),
        sa.Column("max_wait_seconds", sa.Float(), nullable=False),
        sa.Column("max_attempts", sa.Integer(), nullable=False),
        sa.Column("park_seconds", sa.Float(), nullable=False),
        sa.Column("fallback", sqlmodel.sql.sqltypes.AutoString(length=64), nullable=True),
        sa.Column("preflight", sqlmodel.sql.sqltypes.AutoString(), nullable=True),
        sa.Column("preflight_timeout", sa.Float(), nullable=False),
        sa.Column("period", sqlmodel.sql.sqltypes.AutoString(length=16), nullable=False),
        sa.Column("stopped", sa.Boolean(), nullable=False),
        sa.Column("spent", sa.BigInteger(), nullable=False),
        sa.Column("reserved", sa.BigInteger(), nullable=False),
        sa.Column("overage", sa.BigInteger(), nullable=False),
        sa.Column("leased", sa.Integer(), nullable=False),
        sa.Column("window_start", sa.Float(), nullable=False),
        sa.Column("window_used", sa.BigInteger(), nullable=False),
        sa.Column("period_start", sa.Float(), nullable=False),
        sa.Column("preflight_ok", sa.Boolean(), nullable=False),
        sa.Column("preflight_error", sqlmodel.sql.sqltypes.AutoString(), nullable=True),
        sa.Column("preflight_at", sa.Float(), nullable=True),
        sa.Column("updated_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("name"),
        sa.CheckConstraint(
            "spent >= 0 and reserved >= 0 and overage >= 0 and leased >= 0",
            name="ck_lane_counters",
        ),
        sa.CheckConstraint("ceiling > 0 and burst_tokens > 0 and max_leased > 0", name="ck_lane_policy"),
    )
    op.create_table(
        "lane_run",
        sa.Column("lane", sqlmodel.sql.sqltypes.AutoString(length=64), nullable=False),
        sa.Column("run_key", sqlmodel.sql.sqltypes.AutoString(), nullable=False),
        sa.Column("started_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("lane", "run_key"),
    )
    op.create_table(
        "settlement",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), autoincrement=True, nullable=False),
        sa.Column("job_id", sqlmodel.sql.sqltypes.AutoString(length=64), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("lane", sqlmodel.sql.sqltypes.AutoString(length=64), nullable=False),
        sa.Column("est", sa.BigInteger(), nullable=False),
        sa.Column("actual", sa.BigInteger(), nullable=False),
        sa.Column("overage", sa.BigInteger(), nullable=False),
        sa.Column("late", sa.Boolean(), nullable=False),
        sa.Column("outcome", sqlmodel.sql.sqltypes.AutoString(length=16), nullable=False),
        sa.Column("settled_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("job_id", "attempt", name="uq_settlement_job_attempt"),
        sa.CheckConstraint("actual >= 0 and overage >= 0", name="ck_settlement_numbers"),
    )
    with op.batch_alter_table("settlement", schema=None) as batch_op:
        batch_op.create_index("ix_settlement_lane_at", ["lane", "settled_at"], unique=False)

    op.create_table(
        "shadow_estimate",
        sa.Column("job_id", sqlmodel.sql.sqltypes.AutoString(length=64), nullable=False),
        sa.Column("version", sqlmodel.sql.sqltypes.AutoString(length=128), nullable=False),
        sa.Column("est", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("job_id", "version"),
    )
    op.create_table(
        "tail",
        sa.Column("job_id", sqlmodel.sql.sqltypes.AutoString(length=64), nullable=False),
        sa.Column("lane", sqlmodel.sql.sqltypes.AutoString(length=64), nullable=False),
        sa.Column("stage", sqlmodel.sql.sqltypes.AutoString(), nullable=False),
        sa.Column("est", sa.BigInteger(), nullable=False),
        sa.Column("reason", sqlmodel.sql.sqltypes.AutoString(), nullable=False),
        sa.Column("parked_at", sa.Float(), nullable=False),
        sa.Column("deadline", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("job_id"),
    )
    with op.batch_alter_table("tail", schema=None) as batch_op:
        batch_op.create_index("ix_tail_lane_deadline", ["lane", "deadline"], unique=False)

    # The two lanes every ledger starts with, from the policy's one table of defaults.
    from lane_plugin.policy import DEFAULT_LANES

    counters = dict(
        spent=0,
        reserved=0,
        overage=0,
        leased=0,
        window_start=0.0,
        window_used=0,
        period_start=0.0,
        preflight_ok=True,
        updated_at=0.0,
    )
    rows = [dict(settings, **counters, name=name) for name, settings in DEFAULT_LANES.items()]
    op.bulk_insert(sa.table("lane", *(sa.column(c) for c in rows[0])), rows)


def downgrade() -> None:
    with op.batch_alter_table("tail", schema=None) as batch_op:
        batch_op.drop_index("ix_tail_lane_deadline")

    op.drop_table("tail")
    op.drop_table("shadow_estimate")
    with op.batch_alter_table("settlement", schema=None) as batch_op:
        batch_op.drop_index("ix_settlement_lane_at")

    op.drop_table("settlement")
    op.drop_table("lane_run")
    op.drop_table("lane")
    with op.batch_alter_table("job", schema=None) as batch_op:
        batch_op.drop_index("ix_job_run")
        batch_op.drop_index("ix_job_lease")
        batch_op.drop_index("ix_job_deadline")
        batch_op.drop_index("ix_job_aging")
        batch_op.drop_index("ix_job_admission")

    op.drop_table("job")
