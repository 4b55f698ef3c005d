"""The simulated lane's settings as ``lane simulate`` takes them: an existing lane's (``--lane``), ``--limit``
specs, and rule 12's flags, each as :class:`~lane_plugin.sim.config.SimConfig` fields.
"""

from __future__ import annotations

from typing import Optional

from ..policy.limits import EXTRA_UNITS, NO_TOKENS_LIMIT, TOKENS, Limit, parse_limit  # noqa: F401 - Limit: doctest
from .config import PERIODS

# The policy fields a lane row and SimConfig share.
LANE_FIELDS = (
    "ceiling",
    "allowance",
    "start_fraction",
    "burst_tokens",
    "window_seconds",
    "max_leased",
    "lease_seconds",
    "max_wait_seconds",
    "max_attempts",
    "rate_basis",
    "headroom_sigmas",
    "overtake_slack",
)


def lane_settings(url: Optional[str], name: str) -> dict:
    """The policy fields of an existing lane, and its tenants' weights, read through the ledger."""
    from ..ledger import Ledger

    ledger = Ledger(url, create=False)  # a read: a typo in --db must not leave an empty ledger behind
    try:
        row = ledger.lane(name)
        weights = tuple((t["tenant"], t["weight"]) for t in ledger.tenants(name))
    finally:
        ledger.close()
    out = {f: getattr(row, f) for f in LANE_FIELDS}
    out["period_seconds"] = PERIODS.get(row.period)
    out["tenant_weights"] = weights
    out["limits"] = row.limits
    if row.overtake_slack is not None and row.overtake_q is not None:
        out["overtake_learned"] = row.overtake_q  # the Q it learned (or was seeded): its keys read it now
    return out


def rule_12(
    settings: dict, slack: Optional[str], beta: Optional[float], learned: Optional[int], day: Optional[int]
) -> None:
    """``--overtake-slack C|off``, ``--overtake-beta B``, ``--overtake-learned Q`` and ``--overtake-day D`` over
    ``settings`` (the --lane's, or none): only those given change it. A beta alone turns the slack off; the rule
    off, or a day asked for, drops the Q a --lane had learned (unless ``--overtake-learned`` gives one)."""
    if slack is not None:
        if slack.strip().lower() == "off":
            settings["overtake_slack"] = None
        else:
            try:
                if not slack.isascii() or "_" in slack:
                    raise ValueError(slack)
                settings["overtake_slack"] = float(slack)
            except ValueError:
                raise ValueError(f"overtake_slack={slack!r} must be a number >= 1 or off") from None
    if beta is not None:
        settings["overtake_beta"] = beta
        if slack is None:  # a beta alone turns the slack off (both given: SimConfig refuses them, naming both)
            settings["overtake_slack"] = None
        settings["overtake_exact"] = False  # (the index heads it was measured with)
    if day is not None:
        settings["overtake_day"] = day
    if settings.get("overtake_slack", "default") is None or day is not None:
        settings.pop("overtake_learned", None)
    if learned is not None:
        settings["overtake_learned"] = learned


def apply_limits(settings: dict, specs: list[str], given: dict[str, object]) -> None:
    """``--limit UNIT=AMOUNT/WINDOW`` (``lane lanes set``'s syntax) over ``settings``: ``tokens`` is the burst window.

    ``given``: the flags set beside them (``--burst-tokens``, ``--window-seconds``), which a ``tokens`` limit
    would contradict.

    Raises:
        ValueError: a limit that does not parse, a unit given twice, or ``tokens`` beside the burst flags.

    Example:
        >>> s = {}
        >>> apply_limits(s, ["requests=12/10s", "tokens=none"], {})
        >>> s["limits"], s["burst_tokens"] == NO_TOKENS_LIMIT
        ((('requests', Limit(amount=12, window_seconds=10.0)),), True)
    """
    limits = dict(settings.get("limits", ()))
    seen: set[str] = set()
    for spec in specs:
        unit, lim = parse_limit(spec)
        if unit in seen:
            raise ValueError(f"--limit {spec!r}: {unit} is limited twice")
        seen.add(unit)
        if unit == TOKENS:
            both = [flag for flag, v in given.items() if v is not None]
            if both:
                raise ValueError(f"--limit {spec!r} and {', '.join(both)} both set the tokens window: choose one")
            settings["burst_tokens"] = NO_TOKENS_LIMIT if lim is None else lim.amount
            if lim is not None:
                settings["window_seconds"] = lim.window_seconds
        elif lim is None:
            limits.pop(unit, None)
        else:
            limits[unit] = lim
    settings["limits"] = tuple((u, limits[u]) for u in EXTRA_UNITS if u in limits)
