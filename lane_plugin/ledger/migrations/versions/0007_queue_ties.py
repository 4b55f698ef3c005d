"""queue ties: the admission index ends with the job id, so equal priorities keep one order

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-29 23:50:00

Two waiting jobs with the same priority were read in whatever order the database met them (on
PostgreSQL, where an UPDATE had moved a row: a reopened job went behind a later one on one backend and
not the other). The head read orders by (prio, id) and the index serves that order as it is.
"""

from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("job", schema=None) as b:
        b.drop_index("ix_job_queue")
        b.create_index("ix_job_queue", ["lane", "state", "finishing", "prio", "id"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("job", schema=None) as b:
        b.drop_index("ix_job_queue")
        b.create_index("ix_job_queue", ["lane", "state", "finishing", "prio"], unique=False)
