"""rule 12 on by default: every lane with it off gets the default slack and starts its learning day

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-05 03:30:00

Rule 12 (lane_plugin.ledger.overtake) is on by default from here: a new lane gets ``overtake_slack`` 1.25
(lane_plugin.policy.defaults.LANE_DEFAULTS), and so does every lane with the rule off, the two lanes of a new
ledger included. Each starts its learning day at its next refit (``overtake_since`` is left null until then, so
the day is counted by the ledger's clock, not this host's): for a day it numbers its arrivals but holds nobody
back (the order as before), then it binds with the p99 backlog it learned. The jobs
waiting at the upgrade keep their places and are numbered by the lane's next refit (within 5 minutes; the sweep
that numbers an intake that raced the rule being turned on), long before the learning day ends.
``lane lanes set LANE --overtake-slack off`` turns it off again.

Downgrade: the slack stays as the upgrade left it (0019 has the rule; which lanes had it off before is not kept).
"""

import sqlalchemy as sa
from alembic import op

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None

SLACK = 1.25  # (lane_plugin.policy.defaults.LANE_DEFAULTS["overtake_slack"], as it stood at 0020)


def upgrade() -> None:
    # overtake_since stays null: the lane's next refit starts its learning day by the ledger's own clock
    op.execute(
        sa.text("update lane set overtake_slack = :c, overtake_q = null where overtake_slack is null").bindparams(
            c=SLACK
        )
    )


def downgrade() -> None:
    pass
