"""tenants: one lane shared fairly by tokens (the Virtual Token Counter), with weights and tenant budgets

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-03 03:40:00

- job.tenant: who the job belongs to inside its lane (a deployment, a flow, a team); 'default' for the
  jobs of before;
- ix_job_tenant_queue on job (lane, tenant, state, finishing, prio, id): ix_job_queue's order per tenant,
  so that admission reads the head of each tenant's queue, never the whole queue;
- ix_job_tenant_gated: the same for the gated jobs still waiting (ix_job_gated per tenant);
- tenant: one row per (lane, tenant): its weight, optional budget (ceiling, period), what it has spent in
  that period, its weighted service ``served`` (tokens admitted / weight, trued up to actuals at
  settlement: the Virtual Token Counter) and whether admission last saw it backlogged.

Existing rows: every job is tenant 'default'; each lane with jobs gets its 'default' tenant row (weight 1,
no budget) with what its settlements billed as ``spent``; other tenants get their row at their first submit.
"""

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None

_WHERE = "state = 'new' and waiter is not null"


def upgrade() -> None:
    op.create_table(
        "tenant",
        sa.Column("lane", sqlmodel.sql.sqltypes.AutoString(length=64), nullable=False),
        sa.Column("name", sqlmodel.sql.sqltypes.AutoString(length=64), nullable=False),
        sa.Column("weight", sa.Float(), nullable=False, server_default="1.0"),
        sa.Column("ceiling", sa.BigInteger(), nullable=True),
        sa.Column("period", sqlmodel.sql.sqltypes.AutoString(length=16), nullable=False, server_default="none"),
        sa.Column("period_start", sa.Float(), nullable=False, server_default="0"),
        sa.Column("spent", sa.BigInteger(), nullable=False, server_default="0"),
        sa.Column("served", sa.Float(), nullable=False, server_default="0"),
        sa.Column("backlogged", sa.Boolean(), nullable=False, server_default=sa.false()),
        sa.Column("updated_at", sa.Float(), nullable=False, server_default="0"),
        sa.CheckConstraint("weight >= 1 and spent >= 0 and (ceiling is null or ceiling > 0)", name="ck_tenant_numbers"),
        sa.CheckConstraint("period in ('none', 'daily', 'monthly')", name="ck_tenant_period"),
        sa.PrimaryKeyConstraint("lane", "name"),
    )
    with op.batch_alter_table("job", schema=None) as b:
        b.add_column(
            sa.Column("tenant", sqlmodel.sql.sqltypes.AutoString(length=64), nullable=False, server_default="default")
        )
    op.create_index("ix_job_tenant_queue", "job", ["lane", "tenant", "state", "finishing", "prio", "id"], unique=False)
    op.create_index(
        "ix_job_tenant_gated",
        "job",
        ["lane", "tenant", "finishing", "prio", "id"],
        unique=False,
        sqlite_where=sa.text(_WHERE),
        postgresql_where=sa.text(_WHERE),
    )
    op.execute(
        "insert into tenant (lane, name, spent) select l.name, 'default', coalesce((select sum(s.actual) from "
        "settlement s where s.lane = l.name), 0) from lane l where exists (select 1 from job j where j.lane = l.name)"
    )


def downgrade() -> None:
    op.drop_index("ix_job_tenant_gated", table_name="job")
    op.drop_index("ix_job_tenant_queue", table_name="job")
    with op.batch_alter_table("job", schema=None) as b:
        b.drop_column("tenant")
    op.drop_table("tenant")
