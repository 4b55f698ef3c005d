"""rule 12 on by default: every lane with it off gets the default slack and starts its learning day

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-05 03:30:00

Rule 12 (lane_plugin.ledger.overtake) is on by default from here: a new lane gets ``overtake_slack`` 1.25
(lane_plugin.policy.defaults.LANE_DEFAULTS), and so does every lane with the rule off, the two lanes of a new
ledger included. Each starts its learning day at its next refit (``overtake_since`` is left null until then, so
the day is counted by the ledger's clock, not this host's): for a day it numbers its arrivals but holds nobody
back (the order as before), then it binds with the p99 backlog it learned. The jobs
waiting at the upgrade are numbered by the lane's next refit (within 5 minutes; the sweep that numbers an intake
that raced the rule being turned on), after any that entered since (harmless: nothing binds on the learning day,
and learning ``Q`` numbers every waiting job afresh). A lane turned off on purpose before cannot be told from one
never set (both null): it is turned on too; ``lane lanes set LANE --overtake-slack off`` turns it off again.

Downgrade: a lane still on its learning day at the default slack (no ``Q``) is turned off again, as 0019's code
had it by default, and so is one set to 1.25 on purpose that is still learning (the two cannot be told apart; it
lost nothing that bound: turn it on again after the downgrade); a lane that has learned ``Q`` (or had one seeded)
keeps the rule.
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


_LEARNING = "select name from lane where overtake_slack = :c and overtake_q is null"


def downgrade() -> None:
    # Off, as a setting change turns it off: the waiting jobs' numbers and the epoch counters forgotten.
    op.execute(
        sa.text(
            "update job set arrival_pos = null, arrival_epoch = null, overtake_base = null "
            f"where state = 'new' and lane in ({_LEARNING})"
        ).bindparams(c=SLACK)
    )
    op.execute(sa.text(f"delete from lane_epoch where lane in ({_LEARNING})").bindparams(c=SLACK))
    op.execute(
        sa.text(
            "update lane set overtake_slack = null, overtake_since = null "
            "where overtake_slack = :c and overtake_q is null"
        ).bindparams(c=SLACK)
    )
