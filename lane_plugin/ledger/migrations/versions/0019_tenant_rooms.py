"""rule 12's rooms per tenant: a job is charged only for the passes of its own tenant's younger jobs

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-05 03:10:00

- lane_epoch (lane, tenant, epoch, passed): the epoch counters kept per tenant (positions stay the lane's
  arrival order): an admission adds its rate only to its own tenant's older epochs.
- ix_job_rooms (lane, tenant, arrival_epoch, overtake_base): an epoch's least room, per tenant.
- ix_job_tenant_arrival (lane, tenant, arrival_pos): each tenant's oldest numbered waiting jobs; it replaces
  ix_job_arrival (lane, arrival_pos), which nothing reads once the oldest are read per tenant.

Existing rows: the epoch counters are dropped and every numbered waiting job is to be numbered again by its lane's
next tick (as a change of the lane's slack does, lane_plugin.ledger.overtake.restart): rooms counted lane-wide are
not a tenant's.
"""

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None

_WHERE = "state = 'new' and arrival_pos is not null"
_RENUMBER = (
    "update job set arrival_pos = -1, arrival_epoch = null, overtake_base = null "
    "where state = 'new' and arrival_pos is not null"
)


def _epochs(*key: str) -> None:
    op.create_table(
        "lane_epoch",
        sa.Column("lane", sqlmodel.sql.sqltypes.AutoString(length=64), nullable=False),
        *(
            [sa.Column("tenant", sqlmodel.sql.sqltypes.AutoString(length=64), nullable=False)]
            if "tenant" in key
            else []
        ),
        sa.Column("epoch", sa.BigInteger(), nullable=False),
        sa.Column("passed", sa.BigInteger(), nullable=False, server_default="0"),
        sa.PrimaryKeyConstraint(*key),
    )


def _index(name: str, *columns: str) -> None:
    op.create_index(
        name, "job", list(columns), unique=False, sqlite_where=sa.text(_WHERE), postgresql_where=sa.text(_WHERE)
    )


def upgrade() -> None:
    op.execute(sa.text(_RENUMBER))
    op.drop_table("lane_epoch")
    _epochs("lane", "tenant", "epoch")
    op.drop_index("ix_job_rooms", table_name="job")
    _index("ix_job_rooms", "lane", "tenant", "arrival_epoch", "overtake_base")
    op.drop_index("ix_job_arrival", table_name="job")  # (read by nothing now: each tenant's oldest, by the next)
    _index("ix_job_tenant_arrival", "lane", "tenant", "arrival_pos")


def downgrade() -> None:
    op.execute(sa.text(_RENUMBER))
    op.drop_index("ix_job_tenant_arrival", table_name="job")
    _index("ix_job_arrival", "lane", "arrival_pos")
    op.drop_index("ix_job_rooms", table_name="job")
    _index("ix_job_rooms", "lane", "arrival_epoch", "overtake_base")
    op.drop_table("lane_epoch")
    _epochs("lane", "epoch")
