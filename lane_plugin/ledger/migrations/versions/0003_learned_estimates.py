"""estimates that learn

job.est_input: the input tokens counted at intake, so a learned estimator can learn
output = actual - input from settled jobs (those whose settlement has by_estimate, from
0002, are never learned from). estimator_state: a learned estimator's fitted state per
stage, shared by every process and machine.

Revision ID: 0003
Revises: 0002
"""

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("job", schema=None) as batch_op:
        batch_op.add_column(sa.Column("est_input", sa.BigInteger(), nullable=True))
    op.create_table(
        "estimator_state",
        sa.Column("estimator", sqlmodel.sql.sqltypes.AutoString(length=64), nullable=False),
        sa.Column("stage", sqlmodel.sql.sqltypes.AutoString(), nullable=False),
        sa.Column("revision", sqlmodel.sql.sqltypes.AutoString(length=16), nullable=False),
        sa.Column("allowance", sa.BigInteger(), nullable=False),
        sa.Column("jobs", sa.Integer(), nullable=False),
        sa.Column("mean", sa.Float(), nullable=False),
        sa.Column("m2", sa.Float(), nullable=False),
        sa.Column("mean_input", sa.Float(), nullable=False),
        sa.Column("p50", sa.Float(), nullable=False),
        sa.Column("p90", sa.Float(), nullable=False),
        sa.Column("p99", sa.Float(), nullable=False),
        sa.Column("fitted_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("estimator", "stage"),
    )


def downgrade() -> None:
    op.drop_table("estimator_state")
    with op.batch_alter_table("job", schema=None) as batch_op:
        batch_op.drop_column("est_input")
