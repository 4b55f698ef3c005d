"""Every lane setting's default, the one place they are written, and the two lanes of a new ledger.

The ledger's table (``lane_plugin.ledger.models.Lane``), a lane created by ``lane lanes set NEW``,
:class:`~lane_plugin.policy.LanePolicy` and the simulator read them here.
"""

from __future__ import annotations

from typing import Any

# start_fraction 1.0: the finishing reserve keeps what runs under way need; nothing is left
# idle when nothing needs it. Set 0.8 for the article's flat stop at 80% of the ceiling.
LANE_DEFAULTS: dict[str, Any] = dict(
    allowance=10_000_000,
    ceiling=8_000_000,
    start_fraction=1.0,
    burst_tokens=40_000,
    window_seconds=1.0,
    max_leased=25,
    lease_seconds=90.0,
    max_wait_seconds=600.0,
    max_attempts=3,
    park_seconds=86_400.0,
    fallback=None,
    preflight=None,
    preflight_timeout=2.0,
    period="none",
    stopped=False,
    rate_basis="request",
    headroom_sigmas=2.0,
    # Rule 12 (lane_plugin.policy.slack): the lane's p99 of rate tokens ahead of a job within 1.25x token-fifo's (each
    # tenant's own jobs), from its second day (the first it learns the p99 backlog; lane_plugin.ledger.overtake).
    # None: off, the order alone.
    overtake_slack=1.25,
)
# Settings added after the first schema: migration 0001 writes DEFAULT_LANES without them and
# their own migration adds the column with the default above.
LATER_SETTINGS = ("rate_basis", "headroom_sigmas", "overtake_slack")
_FIRST = {k: v for k, v in LANE_DEFAULTS.items() if k not in LATER_SETTINGS}
# The two lanes of a new ledger: the free tier (the article's 10M with an 80% ceiling) and a paid one.
DEFAULT_LANES: dict[str, dict[str, Any]] = {
    "free": dict(_FIRST),
    "paid": dict(_FIRST, allowance=100_000_000, ceiling=100_000_000, burst_tokens=400_000, max_leased=100),
}
# What the provider's rate limiter counts: the rate_cost at request time, or the tokens really
# used (settlement then replaces the request's charge in the window with the actual).
RATE_BASES = ("request", "actual")
