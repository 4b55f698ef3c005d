"""an operator may clear a lane's drift allowance

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-30 06:00:00

- lane.drift_cleared_at: set by `lane lanes clear-drift` (Ledger.clear_drift) to the latest of its time
  and the lane's last settlement; the refit learns the drift allowance only from settlements after it,
  so the settlement that taught an outlier (a report_usage typo) is not relearned at the next refit.

Existing lanes: null (never cleared: learned from the latest settlements, as before).
"""

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("lane", schema=None) as b:
        b.add_column(sa.Column("drift_cleared_at", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("lane", schema=None) as b:
        b.drop_column("drift_cleared_at")
