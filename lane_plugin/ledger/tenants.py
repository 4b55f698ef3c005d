"""Tenants of a lane in the store: their rows, their counters, and the head of each one's queue.

The rule is :mod:`lane_plugin.policy.fairness`'s; this module reads and writes what it needs inside the
admission transaction (under the lane's lock): the lane's tenant rows (a small table, one row per tenant
of the lane), the head of each tenant's queue (``ix_job_tenant_queue`` / ``ix_job_tenant_gated``), the
estimates of the lane's leased jobs per tenant (at most ``max_leased`` rows) when a tenant has a budget,
and, after the decision, each tenant's weighted service and budget re-check. Settlement trues a tenant's
counter up to the actual and adds it to the tenant's ``spent``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from ..errors import LaneError
from ..policy.fairness import TenantState, lift
from . import queries
from .db import Cursor
from .periods import period_start


@dataclass
class TenantRow:
    """A ``tenant`` row as admission reads it (``spent`` as of now: a rolled period counts from 0)."""

    name: str
    weight: float
    served: float
    ceiling: int | None
    period: str
    period_start: float
    spent: int
    backlogged: bool

    def state(self, reserved: int = 0) -> TenantState:
        return TenantState(self.weight, self.served, self.ceiling, self.spent, reserved, self.period != "none")


def ensure(cur: Cursor, lane: str, names: Iterable[str], now: float) -> None:
    """Give each tenant a row in ``lane`` (weight 1, no budget) if it has none."""
    for name in sorted(set(names)):
        cur.execute(queries.TENANTS_ENSURE, {"l": lane, "n": name, "now": now})


def of_lane(cur: Cursor, lane: str, now: float) -> dict[str, TenantRow]:
    """The lane's tenants by name; a budget period that rolled over is reset (the lane is locked)."""
    out: dict[str, TenantRow] = {}
    for r in cur.all(queries.TENANTS_OF_LANE, {"l": lane}):
        row = TenantRow(r[0], float(r[1]), float(r[2]), r[3], r[4], float(r[5]), int(r[6]), bool(r[7]))
        ps = period_start(row.period, now)
        if row.period != "none" and ps > row.period_start:
            cur.execute(queries.TENANTS_OF_LANE_UPDATE_TENANT, {"ps": ps, "l": lane, "n": row.name})
            row.spent, row.period_start = 0, ps
        out[row.name] = row
    return out


def reserved_of(cur: Cursor, lane: str) -> dict[str, int]:
    """The estimates of the lane's leased jobs per tenant (at most ``max_leased`` rows, by ix_job_queue)."""
    rows = cur.all(queries.TENANTS_RESERVED_OF, {"l": lane})
    return {t: int(s or 0) for t, s in rows}


def states(
    cur: Cursor, lane: str, rows: dict[str, TenantRow], backlogged: set[str], now: float
) -> dict[str, TenantState]:
    """The tenants as the policy sees them: returning tenants lifted, backlog flags written, budgets with
    their leased estimates. Writes only the rows that change."""
    served = {n: r.served for n, r in rows.items()}
    was = {n for n, r in rows.items() if r.backlogged}
    for name, floor in lift(served, was, backlogged).items():
        cur.execute(queries.TENANTS_SET_SERVED, {"s": floor, "l": lane, "n": name})
        rows[name].served = floor
    for name, row in rows.items():
        if row.backlogged != (name in backlogged):
            cur.execute(queries.TENANTS_SET_BACKLOGGED, {"b": name in backlogged, "l": lane, "n": name})
            row.backlogged = name in backlogged
    reserved = reserved_of(cur, lane) if any(r.ceiling is not None for r in rows.values()) else {}
    return {n: r.state(reserved.get(n, 0)) for n, r in rows.items()}


def charge(
    cur: Cursor,
    lane: str,
    rows: dict[str, TenantRow],
    by_tenant: Iterable[tuple[str, int]],
    reserved_before: dict[str, TenantState],
    now: float,
) -> None:
    """After a decision: each tenant's weighted service grows by its admitted tokens / weight; a budget is
    re-checked by the UPDATE itself (a bug in the policy fails the transaction, never overspends a tenant)."""
    for name, tokens in by_tenant:
        row = rows.get(name)
        if row is None:
            continue  # a tenant with no row (a job of before migration 0014): weight 1, no budget, not counted
        state = reserved_before.get(name)
        cur.execute(
            queries.TENANTS_CHARGE,
            {
                "d": tokens / row.weight,
                "now": now,
                "l": lane,
                "n": name,
                "t": tokens,
                "r": state.reserved if state is not None else 0,
            },
        )
        if cur.rowcount != 1:
            raise LaneError(
                f"admission re-check failed in lane {lane!r}: the policy chose past the ceiling of tenant {name!r}"
            )


# Settlement: the tenant's spent (in its period, rolled here as at admission) and its counter trued up to the actual.
_SETTLE_SQL = queries.TENANTS_SETTLE_SQL
SETTLE_JOINED_SQL = queries.TENANTS_SETTLE_JOINED_SQL  # PostgreSQL's one-statement settlement (settlement.py)


def settle_params(lane: str, tenant: str, actual: int, est: int, now: float) -> dict:
    return {
        "pd": period_start("daily", now),
        "pm": period_start("monthly", now),
        "a": actual,
        "e": est,
        "l": lane,
        "n": tenant,
    }


def settle(cur: Cursor, lane: str, tenant: str, *, actual: int, est: int, now: float) -> None:
    """A settlement of a job of ``tenant`` billed in ``lane``: its spent grows, its counter is trued up."""
    cur.execute(_SETTLE_SQL, settle_params(lane, tenant, actual, est, now))


# -- configuring and listing (``lane tenants``) -----------------------------------------------------------


def set_tenant(
    cur: Cursor,
    now: float,
    lane: str,
    name: str,
    *,
    create: bool,
    weight: float | None,
    ceiling: int | None,
    no_ceiling: bool,
    period: str | None,
    force: bool = False,
) -> dict:
    """Change (or, with ``create``, add) a tenant of ``lane``; returns its row as :func:`listing` gives it.

    A name the lane has never seen (no row, no job) is refused unless ``create``, suggesting the closest
    one it has: a typo would otherwise give a weight to a tenant nobody submits as. A ceiling under what the
    tenant has already admitted this period is refused unless ``force``, as a lane's is: its jobs would wait
    until the next reset (without a period, for ever) and ``lane audit`` would report I1.
    """
    from ..errors import UnknownTenant
    from .lanes import lock_lane

    lock_lane(cur, lane)  # UnknownLane; and a budget changes under the lane's lock, as admission reads it
    known = [r[0] for r in cur.all(queries.TENANTS_SET_TENANT_SELECT_TENANT, {"l": lane})]
    if name not in known:
        if not create:
            raise UnknownTenant(name, lane, known)
        ensure(cur, lane, (name,), now)
    sets: dict = {}
    if weight is not None:
        sets["weight"] = float(weight)
    if no_ceiling:
        sets["ceiling"] = None
    elif ceiling is not None:
        sets["ceiling"] = ceiling
    if period is not None:  # its spent counts from the start of the new period (I3 per tenant)
        ps = period_start(period, now)
        sets["period"], sets["period_start"] = period, ps
        sets["spent"] = int(cur.scalar(queries.TENANTS_SET_TENANT_SELECT_SETTLEMENT, {"l": lane, "n": name, "p": ps}))
    if sets:
        cur.execute(queries.tenants_update(sets), {**sets, "now": now, "l": lane, "n": name})
    if sets.get("ceiling") is not None and not force:
        _refuse_a_ceiling_under_admitted(cur, now, lane, name, sets["ceiling"])
    return next(t for t in listing(cur, now, lane) if t["tenant"] == name)


def _refuse_a_ceiling_under_admitted(cur: Cursor, now: float, lane: str, name: str, ceiling: int) -> None:
    """InvalidInput (the transaction then writes nothing) if ``ceiling`` is under what the tenant admitted this
    period, counted as ``lane audit`` counts it: spent - overage + reserved."""
    from ..errors import InvalidInput

    row = of_lane(cur, lane, now)[name]  # its period rolled as admission rolls it
    _, overage, reserved = cur.one(queries.AUDIT_TENANT_SPEND, {"l": lane, "t": name, "p": row.period_start})
    admitted = row.spent - int(overage) + int(reserved)
    if ceiling < admitted:
        raise InvalidInput(
            "ceiling",
            ceiling,
            (
                f"tenant {name!r} of lane {lane!r} would get a ceiling of {ceiling:,}, under the {admitted:,} tokens it "
                f"has already admitted this period (spent {row.spent:,} - overage {int(overage):,} + reserved "
                f"{int(reserved):,}): its jobs would wait until the next reset, and lane audit reports I1; pass --force "
                "(force=True) to lower it anyway"
            ),
        )


def listing(cur: Cursor, now: float, lane: str | None = None) -> list[dict]:
    """Every tenant (of ``lane``): weight, budget, spent, reserved, waiting, counter, and its share of the
    lane's tokens settled over the last hour (``share_1h``, 0 to 1; None: the lane settled none)."""
    if lane:
        rows = cur.all(queries.TENANTS_LISTING_OF_LANE, {"l": lane})
    else:
        rows = cur.all(queries.TENANTS_LISTING, {})
    lanes = sorted({r[0] for r in rows})
    reserved: dict[tuple[str, str], int] = {}
    waiting: dict[tuple[str, str], int] = {}
    hour: dict[tuple[str, str], int] = {}
    for ln in lanes:
        for t, s in reserved_of(cur, ln).items():
            reserved[ln, t] = s
        for t, n in cur.all(queries.TENANTS_LISTING_SELECT_JOB, {"l": ln}):
            waiting[ln, t] = int(n)
        for t, s in cur.all(queries.TENANTS_LISTING_SELECT_SETTLEMENT, {"l": ln, "since": now - 3600.0}):
            hour[ln, t] = int(s or 0)
    out = []
    for r in rows:
        ln, name = r[0], r[1]
        ps = period_start(r[5], now)
        spent = 0 if r[5] != "none" and ps > float(r[6]) else int(r[7])  # a period that rolled counts from 0
        lane_hour = sum(v for (x, _), v in hour.items() if x == ln)
        out.append(
            {
                "lane": ln,
                "tenant": name,
                "weight": float(r[2]),
                "ceiling": r[4],
                "period": r[5],
                "spent": spent,
                "reserved": reserved.get((ln, name), 0),
                "waiting": waiting.get((ln, name), 0),
                "served": float(r[3]),
                "backlogged": bool(r[8]),
                "tokens_1h": hour.get((ln, name), 0),
                "share_1h": hour.get((ln, name), 0) / lane_hour if lane_hour else None,
            }
        )
    return out
