"""waiters: who is waiting for a gated job, and whether they are still there

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-29 22:30:00

- waiter: one row per process that waits for gated jobs (``seen``: its last heartbeat; ``gone_at``:
  when it was found gone, its jobs dropped from admission);
- job.waiter: the waiter of a gated job (null for a job submitted from the CLI, pulled by whoever
  ticks, which keeps requeue-on-expiry), indexed so that a waiter's jobs are found without a scan.
"""

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "waiter",
        sa.Column("id", sqlmodel.sql.sqltypes.AutoString(length=64), nullable=False),
        sa.Column("seen", sa.Float(), nullable=False),
        sa.Column("gone_at", sa.Float(), nullable=True),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("job", schema=None) as b:
        b.add_column(sa.Column("waiter", sqlmodel.sql.sqltypes.AutoString(length=64), nullable=True))
        b.create_index("ix_job_waiter", ["waiter"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("job", schema=None) as b:
        b.drop_index("ix_job_waiter")
        b.drop_column("waiter")
    op.drop_table("waiter")
