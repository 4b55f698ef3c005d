"""a settlement with nobody waiting for a lease skips its hand-off: ix_job_gated

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-30 08:40:00

- ix_job_gated: a partial index on job (lane, finishing, prio, id), ix_job_queue's order, of the gated
  jobs still waiting (state 'new', a waiter). A settlement (or a reap) hands its room on only to gated
  jobs: one read of this index tells it whether any waits in the lane at all (none: the hand-off, window
  slide, head read and NOTIFY, is skipped: it could lease nothing), and a tick that leases only waiters'
  jobs (the hand-off, a gate's first tick, the waiters' watcher) reads its head here rather than walking
  ix_job_queue past every CLI job queued ahead. It holds only waiting gated jobs, so it stays as small as
  the gates waiting, whatever the queue of CLI jobs or the history of finished ones.

Existing rows: indexed as they are (no data change).
"""

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None

_WHERE = "state = 'new' and waiter is not null"


def upgrade() -> None:
    op.create_index(
        "ix_job_gated",
        "job",
        ["lane", "finishing", "prio", "id"],
        unique=False,
        sqlite_where=sa.text(_WHERE),
        postgresql_where=sa.text(_WHERE),
    )


def downgrade() -> None:
    op.drop_index("ix_job_gated", table_name="job")
