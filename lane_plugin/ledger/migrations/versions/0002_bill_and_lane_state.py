"""the run's bill and the lane state people were last told

settlement.by_estimate: the attempt was billed its estimate because no usage was found
(the flow run's lane-bill counts them). lane.reported_state: the lane state the last
published status event announced, so a state change is announced once, by whoever sees it first.

Revision ID: 0002
Revises: 0001
"""

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("settlement", schema=None) as batch_op:
        batch_op.add_column(sa.Column("by_estimate", sa.Boolean(), nullable=False, server_default=sa.false()))
    with op.batch_alter_table("lane", schema=None) as batch_op:
        batch_op.add_column(sa.Column("reported_state", sqlmodel.sql.sqltypes.AutoString(length=32), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("lane", schema=None) as batch_op:
        batch_op.drop_column("reported_state")
    with op.batch_alter_table("settlement", schema=None) as batch_op:
        batch_op.drop_column("by_estimate")
