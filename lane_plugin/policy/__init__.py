"""The admission policy, pure: which waiting jobs a lane leases now.

No database, no Prefect, no clock: the store (:mod:`lane_plugin.ledger`) feeds it a snapshot of
one lane and the head of that lane's waiting queue and applies the decision atomically;
``lane simulate`` (:mod:`lane_plugin.sim`) feeds it a simulated clock. Both run this very code.

The package's public names are below; everything else is imported from the module that holds it:

- :mod:`.admission`: :func:`admit` (the rules in order, with their statement), :class:`Decision`, ``HEAD_SLACK``;
- :mod:`.rules`: the rules one job is checked against (``blocking_rule``, ``unfit_before_reset``,
  :func:`never_fits`) and their reasons (``CEILING``, ``BURST``, ...);
- :mod:`.order`: the queue order (``priority``, ``order``) and the bound on how long a job waits;
- :mod:`.fairness`: tenants sharing a lane fairly by tokens (``fair_order``, ``lift``, ``TenantState``) and
  the service-gap bound;
- :mod:`.lane`: :class:`LanePolicy` (a lane's numbers) and :class:`LaneSnapshot` (its state at one instant);
- :mod:`.candidate`: :class:`Candidate` (a waiting job) and its kind (``FINISH``, ``START``, ``FREE``, ``kind_of``);
- :mod:`.reserve`: the finishing reserve learned from finished runs (``fit_runs``, ``REFIT_SECONDS``);
- :mod:`.drift`: the drift allowance learned from settlements (``fit_drift``, ``capped``, ``over_charge``);
- :mod:`.sizeclass`: the size-class boundary of the order (``size_class_boundary``);
- :mod:`.window`: the sliding burst window's clock (``window_expiry``);
- :mod:`.defaults`: every lane setting's default (:data:`LANE_DEFAULTS`) and a new ledger's lanes.

Example:
    >>> from lane_plugin.policy import Candidate, LanePolicy, LaneSnapshot, admit
    >>> lane = LaneSnapshot(LanePolicy(ceiling=1_000, burst_tokens=500), spent=0, reserved=0, leased=0,
    ...                     window_used=0, now=0.0)
    >>> decision = admit(lane, [Candidate("a", 300, 0.0), Candidate("b", 400, 0.0)])
    >>> decision.ids, decision.tokens, decision.head_reason
    (['a'], 300, 'burst')
"""

from __future__ import annotations

from .admission import Decision, admit
from .candidate import Candidate
from .defaults import DEFAULT_LANES, LANE_DEFAULTS
from .lane import LanePolicy, LaneSnapshot
from .rules import never_fits

__all__ = [
    "DEFAULT_LANES",
    "LANE_DEFAULTS",
    "Candidate",
    "Decision",
    "LanePolicy",
    "LaneSnapshot",
    "admit",
    "never_fits",
]
