"""Lane rows: reading, locking and configuring them (their periods: periods.py)."""

from __future__ import annotations

import time
from dataclasses import dataclass, fields

from .. import checks
from ..errors import InvalidInput, LaneError, UnknownLane
from ..policy import LANE_DEFAULTS, LanePolicy, order
from ..policy.defaults import RATE_BASES
from ..policy.drift import over_charge
from ..policy.limits import Limit, limits_of_spec
from . import leases, overtake, queries
from .db import Cursor
from .periods import as_of, repoint_period
from .preflight import validate_spec

POLICY_FIELDS = (
    "allowance",
    "ceiling",
    "start_fraction",
    "burst_tokens",
    "window_seconds",
    "max_leased",
    "lease_seconds",
    "max_wait_seconds",
    "max_attempts",
    "park_seconds",
    "fallback",
    "preflight",
    "preflight_timeout",
    "period",
    "stopped",
    "rate_basis",
    "headroom_sigmas",
    "overtake_slack",
    "overtake_q",
)
COUNTER_FIELDS = (
    "spent",
    "reserved",
    "overage",
    "leased",
    "window_start",
    "window_used",
    "period_start",
    "preflight_ok",
    "preflight_error",
    "preflight_at",
    "updated_at",
    "finishing",
    "profile_at",
    "reserved_var",
    "size_boundary",
    "drift",
    "drift_overrun",
    "drift_spread",
    "drift_cleared_at",
    "paused_until",
    "paused_reason",
    "limit_spec",
    "overtake_since",
    "arrivals",
)
# Settings that move a waiting job's place in the order (lane_plugin.policy.LanePolicy.age_factor).
ORDER_FIELDS = ("ceiling", "burst_tokens", "max_wait_seconds")
PERIODS = ("none", "daily", "monthly")
# A lane created with `lane lanes set NEW ...` starts from the policy's defaults and empty counters.
NEW_LANE = dict(
    LANE_DEFAULTS,
    spent=0,
    reserved=0,
    overage=0,
    leased=0,
    window_start=0.0,
    window_used=0,
    period_start=0.0,
    preflight_ok=True,
    finishing=0,
    profile_at=0.0,
    reserved_var=0,
    size_boundary=None,
    drift=1.0,
    drift_overrun=0,
    drift_spread=0,
    drift_cleared_at=None,
    paused_until=None,
    paused_reason=None,
    limit_spec=None,
    overtake_q=None,
    overtake_since=None,
    arrivals=0,
)


@dataclass
class LaneRow:
    name: str
    allowance: int
    ceiling: int
    start_fraction: float
    burst_tokens: int
    window_seconds: float
    max_leased: int
    lease_seconds: float
    max_wait_seconds: float
    max_attempts: int
    park_seconds: float
    fallback: str | None
    preflight: str | None
    preflight_timeout: float
    period: str
    stopped: bool
    rate_basis: str
    headroom_sigmas: float
    spent: int
    reserved: int
    overage: int
    leased: int
    window_start: float
    window_used: int
    period_start: float
    preflight_ok: bool
    preflight_error: str | None
    preflight_at: float | None
    updated_at: float
    finishing: int
    profile_at: float
    reserved_var: int
    size_boundary: int | None
    drift: float
    drift_overrun: int
    drift_spread: int
    drift_cleared_at: float | None
    paused_until: float | None = None
    paused_reason: str | None = None
    # The lane's limits over requests, input_tokens, output_tokens ("requests=500/60s output_tokens=8000/60s").
    limit_spec: str | None = None
    # Rule 12 (lane_plugin.ledger.overtake): its slack (None: off), the learned p99 of V (None: learning), when
    # it was turned on (it learns Q from a day of arrivals since), the arrival counter.
    overtake_slack: float | None = None
    overtake_q: int | None = None
    overtake_since: float | None = None
    arrivals: int = 0

    @property
    def limits(self) -> tuple[tuple[str, Limit], ...]:
        """The lane's limits other than ``tokens`` (:attr:`lane_plugin.policy.LanePolicy.limits`), from ``limit_spec``."""
        return limits_of_spec(self.limit_spec)

    @property
    def policy(self) -> LanePolicy:
        return LanePolicy.of(self)

    def priority(self, est: int, wait_since: float, finishing: bool = False) -> float:
        """A job's place in this lane's order, by the lane's learned size classes."""
        return order.priority(self.policy, est, wait_since, self.size_boundary, bool(finishing))

    def prio_sql(self, wait: str, finishing: str = "finishing") -> tuple[str, dict]:
        """The same place as an SQL expression over ``job.est``, ``wait`` (a column or a parameter) and
        ``finishing`` (whether the job finishes a run under way: a column or an expression)."""
        if self.size_boundary is None:
            return queries.lane_priority(wait, finishing, False), {"prio_f": self.policy.age_factor}
        params = {
            "prio_f": self.policy.age_factor,
            "prio_b": self.size_boundary,
            "prio_w": float(self.max_wait_seconds),
        }
        return queries.lane_priority(wait, finishing, True), params

    @property
    def hard_stopped(self) -> bool:
        """Stopped by an operator, or the ceiling is spent."""
        return bool(self.stopped) or self.spent >= self.ceiling

    @property
    def is_stopped(self) -> bool:
        return self.hard_stopped or not self.preflight_ok

    @property
    def held(self) -> bool:
        """Admits nothing whatever the numbers: stopped by an operator, or its preflight failed."""
        return bool(self.stopped) or not self.preflight_ok

    @property
    def remaining(self) -> int:
        return self.ceiling - self.spent - self.reserved

    def over(self, tokens: int, jobs: int) -> int:
        """The drift allowance of ``tokens`` of estimates in ``jobs`` jobs in flight (:func:`lane_plugin.policy.drift.over_charge`)."""
        return over_charge(self.drift, self.drift_overrun, self.drift_spread, tokens, jobs)


_COLS = ("name",) + POLICY_FIELDS + COUNTER_FIELDS
_READS = queries.lane_reads(_COLS)


# A statement that writes the lane row can return it whole: ``returning`` these, read by :func:`row_of`.
RETURNING = ", ".join("lane." + c for c in _COLS)


def row_of(r) -> LaneRow:
    """A lane row from the columns of :data:`RETURNING` (or ``_READS``), in order."""
    return _row(r[: len(_COLS)])


def _row(r) -> LaneRow:
    d = dict(zip(_COLS, r))
    d["stopped"] = bool(d["stopped"])
    d["preflight_ok"] = bool(d["preflight_ok"])
    return LaneRow(**d)


def unknown_lane(cur: Cursor, name: str, hint: str = "lane lanes lists them") -> UnknownLane:
    """The error for a lane there is not, suggesting the closest lane there is ("did you mean 'mylane'?")."""
    return UnknownLane(name, hint, known=[r[0] for r in cur.all(queries.LANES_NAMES)])


def read_lane(cur: Cursor, name: str) -> LaneRow:
    r = cur.one(_READS["one"], {"n": name})
    if r is None:
        raise unknown_lane(cur, name)
    return _row(r)


def lock_lane(cur: Cursor, name: str) -> LaneRow:
    """Read a lane row holding its lock until the transaction ends."""
    pg = cur.dialect == "postgresql"
    t0 = time.perf_counter()
    r = cur.one(_READS["lock"] if pg else _READS["one"], {"n": name})
    if pg and cur.locked_at is None:  # the transaction's first lane lock (a re-lock cannot wait)
        cur.locked_at = time.perf_counter()
        if cur.stats is not None:  # how long it was waited for (SQLite: at BEGIN IMMEDIATE), round trip included
            cur.stats.lock_waits.append(cur.locked_at - t0)
    if r is None:
        raise unknown_lane(cur, name)
    return _row(r)


def all_lanes(cur: Cursor, *, lock: bool = False) -> list[LaneRow]:
    sql = _READS["all_locked"] if lock and cur.dialect == "postgresql" else _READS["all"]
    return [_row(r) for r in cur.all(sql)]


# A preflight is a health URL (a signed one, or one with a token, is long) or a check's name: not a short label.
PREFLIGHT_MAX = 4096


def validate_settings(settings: dict, current: LaneRow | None = None) -> dict:
    """Check lane settings; returns them normalised or raises InvalidInput naming the field."""
    out = {}
    for key, value in settings.items():
        if key not in POLICY_FIELDS:
            raise InvalidInput("lane setting", key, f"expected one of {', '.join(POLICY_FIELDS)}")
        if key in ("allowance", "ceiling", "burst_tokens", "max_leased", "max_attempts"):
            value = checks.whole(key, value, low=1)
        elif key in ("start_fraction",):
            value = checks.number(key, value, low=0.0, high=1.0, low_open=True)
        elif key in ("window_seconds", "lease_seconds", "preflight_timeout"):
            value = checks.number(key, value, low=0.0, high=365 * 86400.0, low_open=True)
        elif key == "headroom_sigmas":
            value = checks.number(key, value, low=0.0, high=10.0)
        elif key in ("overtake_slack", "overtake_q"):
            value = overtake.checked(key, value)
        elif key in ("max_wait_seconds", "park_seconds"):
            value = checks.number(key, value, low=0.0, high=10 * 365 * 86400.0)
        elif key == "period":
            if value not in PERIODS:
                raise InvalidInput(key, value, f"expected one of {', '.join(PERIODS)}")
        elif key == "rate_basis":
            if value not in RATE_BASES:
                raise InvalidInput(key, value, f"expected one of {', '.join(RATE_BASES)}")
        elif key == "stopped":
            if not isinstance(value, bool):
                raise InvalidInput(key, value, "expected true or false")
        elif key in ("fallback", "preflight"):
            if value in ("", None):
                value = None
            elif key == "fallback":
                value = checks.text(key, value, limit=64)  # a lane name, checked like one
            else:
                validate_spec(checks.text(key, value, limit=PREFLIGHT_MAX))
        out[key] = value
    merged = {f.name: getattr(current, f.name) for f in fields(LaneRow)} if current else dict(NEW_LANE)
    merged.update(out)
    if "allowance" in out and "ceiling" not in out:
        # A ceiling at its default (80% of the allowance, the seed's headroom) follows a new allowance;
        # one an operator chose stays, and is named if the allowance no longer covers it.
        if current is None or current.ceiling == default_ceiling(current.allowance):
            merged["ceiling"] = out["ceiling"] = default_ceiling(out["allowance"])
        elif merged["ceiling"] > out["allowance"]:
            raise InvalidInput(
                "allowance",
                out["allowance"],
                f"below the lane's ceiling {merged['ceiling']}: lower --ceiling too (at most the allowance)",
            )
    if merged.get("ceiling") and merged.get("allowance") and merged["ceiling"] > merged["allowance"]:
        raise InvalidInput("ceiling", merged["ceiling"], f"must not exceed the allowance {merged['allowance']}")
    return out


def default_ceiling(allowance: int) -> int:
    """A lane's ceiling when only its allowance is given: 80% of it (the seed's FREE_CEILING), at least 1."""
    return max(1, int(allowance * 0.8))


def write_lane_settings(
    cur: Cursor, now: float, name: str, settings: dict, create: bool = True, force: bool = False
) -> LaneRow:
    """Apply checked settings to a lane under its lock, creating it from NEW_LANE if it is new.

    With ``create=False`` an unknown lane raises :class:`UnknownLane` and nothing is written. A ceiling
    lowered (or moved by a new allowance) under what the lane has already admitted this period is refused
    unless ``force``: nothing more is admitted until the next reset (without a period, ever), and
    ``lane audit`` reports I1 for it (a typo such as ``--allowance 5`` would stop the lane silently).
    """
    try:
        current = lock_lane(cur, name)
    except LaneError:
        if not create:
            raise
        current = None
    clean = validate_settings(settings, current)
    if "fallback" in clean and clean["fallback"] is not None:
        if clean["fallback"] == name:
            raise InvalidInput("fallback", clean["fallback"], "a lane cannot fall back to itself")
        read_lane(cur, clean["fallback"])
    if current is None:  # a new lane has the rule's default unless set: it starts its learning day now
        clean.update(overtake.setting_change(None, {"overtake_slack": NEW_LANE["overtake_slack"], **clean}, now))
    else:
        clean.update(overtake.setting_change(current.overtake_slack, clean, now))
    if current is None:
        checks.new_lane_name(name)
        row = {**NEW_LANE, **clean, "name": name, "updated_at": now}
        cur.execute(queries.lanes_insert_lane(row), row)
        if cur.rowcount == 1:
            return read_lane(cur, name)
        # another caller created it a moment ago: change it like an existing one (not with what creating it
        # would have written besides the settings given: its learning day, a seeded Q forgotten)
        current = lock_lane(cur, name)
        clean = validate_settings(settings, current)
        clean.update(overtake.setting_change(current.overtake_slack, clean, now))
    if clean:
        cur.execute(queries.lanes_update_settings(clean), {**clean, "now": now, "name": name})
    if current is not None and clean.get("period", current.period) != current.period:
        repoint_period(cur, current, clean["period"], now)
    if current is not None and any(clean.get(k, getattr(current, k)) != getattr(current, k) for k in overtake.SETTINGS):
        overtake.restart(cur, name)  # rooms counted under another slack or Q (or none) would not be this one's
    if current is not None and clean.get("lease_seconds", current.lease_seconds) < current.lease_seconds:
        leases.bound(cur, name, clean["lease_seconds"], now=now)  # leases granted longer end as the new length allows
    row = read_lane(cur, name)
    if current is not None and row.ceiling < current.ceiling and not force:
        now_row = as_of(row, now)
        admitted = now_row.spent - now_row.overage + now_row.reserved
        if row.ceiling < admitted:
            field = "ceiling" if "ceiling" in settings else "allowance"  # (a default ceiling follows the allowance)
            raise InvalidInput(
                field,
                clean[field],
                (
                    f"lane {name!r} would get a ceiling of {row.ceiling:,}, under the {admitted:,} tokens it has already "
                    f"admitted this period (spent {now_row.spent:,} - overage {now_row.overage:,} + reserved "
                    f"{now_row.reserved:,}): nothing more would be admitted until the next reset, and lane audit reports "
                    "I1; to stop the lane use --stop, or pass --force (force=True) to lower it anyway"
                ),
            )
    if current is not None and any(k in clean and clean[k] != getattr(current, k) for k in ORDER_FIELDS):
        reprioritise(cur, row)
    return row


def clear_drift(cur: Cursor, now: float, name: str) -> LaneRow:
    """Forget the lane's learned drift allowance under its lock: drift 1.0, overrun 0, spread 0 (idempotent).

    ``drift_cleared_at`` becomes the latest of ``now`` and the lane's last settlement, and the refit learns
    the allowance only from settlements after it (:func:`lane_plugin.ledger.runs.refit`): the settlement
    that taught an outlier (a ``report_usage`` typo) is never relearned. Raises :class:`UnknownLane`.
    """
    lock_lane(cur, name)
    last = cur.scalar(queries.LANES_CLEAR_DRIFT_SELECT_SETTLEMENT, {"n": name})
    cur.execute(queries.LANES_CLEAR_DRIFT_UPDATE_LANE, {"c": max(now, float(last or 0.0)), "now": now, "n": name})
    return read_lane(cur, name)


def reprioritise(cur: Cursor, row: LaneRow) -> None:
    """The lane's order settings changed: every waiting or parked job's place follows (one set-based UPDATE)."""
    prio, params = row.prio_sql("wait_since")
    cur.execute(queries.lanes_reprioritise(prio), {**params, "l": row.name})


def delete_lane(cur: Cursor, name: str) -> None:
    """Delete a lane that no job ever used and no lane falls back to (raises otherwise)."""
    lock_lane(cur, name)  # UnknownLane
    jobs = cur.scalar(queries.LANES_DELETE_LANE_SELECT_JOB, {"n": name})
    if jobs:
        raise InvalidInput("lane", name, f"it has {jobs} job(s); stop it instead (lane lanes set {name} --stop)")
    left = cur.scalar(queries.LANES_DELETE_LANE_SELECT_LANE_MOVE, {"n": name})
    if left:  # attempts of theirs ran here: a late settlement of one bills this lane
        raise InvalidInput(
            "lane",
            name,
            f"{left} job(s) ran in it before they moved to their fallback; stop it "
            f"instead (lane lanes set {name} --stop)",
        )
    users = [r[0] for r in cur.all(queries.LANES_DELETE_LANE_SELECT_LANE, {"n": name})]
    if users:
        raise InvalidInput("lane", name, f"lane(s) {', '.join(users)} fall back to it")
    for sql in queries.LANES_DELETE_ROWS.values():
        cur.execute(sql, {"n": name})
    cur.execute(queries.LANES_DELETE_LANE_DELETE_LANE, {"n": name})
