"""rule 12 in the ledger: each waiting job's room, kept per arrival epoch (lane.overtake_slack, off by default)

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-04 18:20:00

- lane.overtake_slack: rule 12's slack ``c`` (lane_plugin.policy.slack); null: the rule is off (the default).
- lane.overtake_q: the p99 of the rate tokens waiting at the lane's arrivals, learned by the refit; null: not yet.
- lane.arrivals: the lane's arrival counter (the next arrival's position is arrivals + 1).
- job.arrival_pos, arrival_epoch (arrival_pos // 64), overtake_key, overtake_base, arrival_v: a waiting job's
  place in arrival order, its key (what younger jobs may take ahead of it), its room's base (its key plus its
  epoch's counter when it was numbered) and the rate tokens it found waiting; arrival_pos -1: waiting to be
  numbered by the lane's next tick (it entered, or entered again, since); null: not numbered (the rule is off).
- lane_epoch (lane, epoch, passed): what younger jobs took ahead of every waiting job of one epoch.
- ix_job_rooms (lane, arrival_epoch, overtake_base) and ix_job_arrival (lane, arrival_pos), partial over the
  numbered waiting jobs (and those waiting to be): an epoch's least room is the head of the first; the jobs to
  number and the oldest numbered ones, ranges of the second.

Existing rows: not numbered (null), every lane off.
"""

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None

_WHERE = "state = 'new' and arrival_pos is not null"


def upgrade() -> None:
    with op.batch_alter_table("lane") as batch_op:
        batch_op.add_column(sa.Column("overtake_slack", sa.Float(), nullable=True))
        batch_op.add_column(sa.Column("overtake_q", sa.BigInteger(), nullable=True))
        batch_op.add_column(sa.Column("arrivals", sa.BigInteger(), nullable=False, server_default="0"))
    with op.batch_alter_table("job") as batch_op:
        batch_op.add_column(sa.Column("arrival_pos", sa.BigInteger(), nullable=True))
        batch_op.add_column(sa.Column("arrival_epoch", sa.BigInteger(), nullable=True))
        batch_op.add_column(sa.Column("overtake_key", sa.BigInteger(), nullable=True))
        batch_op.add_column(sa.Column("overtake_base", sa.BigInteger(), nullable=True))
        batch_op.add_column(sa.Column("arrival_v", sa.BigInteger(), nullable=True))
    op.create_table(
        "lane_epoch",
        sa.Column("lane", sqlmodel.sql.sqltypes.AutoString(length=64), nullable=False),
        sa.Column("epoch", sa.BigInteger(), nullable=False),
        sa.Column("passed", sa.BigInteger(), nullable=False, server_default="0"),
        sa.PrimaryKeyConstraint("lane", "epoch"),
    )
    op.create_index(
        "ix_job_rooms",
        "job",
        ["lane", "arrival_epoch", "overtake_base"],
        unique=False,
        sqlite_where=sa.text(_WHERE),
        postgresql_where=sa.text(_WHERE),
    )
    op.create_index(
        "ix_job_arrival",
        "job",
        ["lane", "arrival_pos"],
        unique=False,
        sqlite_where=sa.text(_WHERE),
        postgresql_where=sa.text(_WHERE),
    )


def downgrade() -> None:
    op.drop_index("ix_job_arrival", table_name="job")
    op.drop_index("ix_job_rooms", table_name="job")
    op.drop_table("lane_epoch")
    with op.batch_alter_table("job") as batch_op:
        for name in ("arrival_v", "overtake_base", "overtake_key", "arrival_epoch", "arrival_pos"):
            batch_op.drop_column(name)
    with op.batch_alter_table("lane") as batch_op:
        for name in ("arrivals", "overtake_q", "overtake_slack"):
            batch_op.drop_column(name)
