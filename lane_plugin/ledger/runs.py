"""The finishing reserve in the ledger: runs under way, what they still need, and what it is learned from.

A run is *under way* in a lane once one of its jobs is admitted there. Its
``lane_run`` row keeps the latest admitted stage and ``remaining``, what the
run is expected to still need after it (the profile's ``after`` for that
stage), until ``expires_at``: a run that admits nothing for its hold is
presumed finished and its reserve lapses. The lane row's ``finishing`` is the
sum of the reserves, maintained with every change, so a tick reads one number.

The profile (``run_profile``: per stage, ``after`` and ``hold``) is refit
outside the admission transaction, at most every ``REFIT_SECONDS``, from the
latest ``FIT_RUNS`` lapsed runs with :func:`lane_plugin.policy.reserve.fit_runs`; with it
the lane's size-class boundary and its drift allowance (``lane.drift``,
``drift_overrun``, ``drift_spread``: :func:`lane_plugin.policy.drift.fit_drift` of the
latest ``DRIFT_SAMPLE`` settlements, after ``drift_cleared_at`` if an operator cleared it).
"""

from __future__ import annotations

from ..policy import Decision
from ..policy.drift import DRIFT_SAMPLE, fit_drift
from ..policy.reserve import FIT_RUNS, REFIT_SECONDS, StageFit, fit_runs, reserve_hold, run_tokens
from ..policy.sizeclass import SIZE_CLASS_SAMPLE, size_class_boundary
from . import overtake, queries
from .db import Cursor
from .lanes import LaneRow, lock_lane


def lapse(cur: Cursor, row: LaneRow, now: float) -> None:
    """Release the reserve of runs that admitted nothing for their hold (lane row locked)."""
    rows = cur.all(queries.RUNS_LAPSE_SELECT_LANE_RUN, {"l": row.name, "now": now})
    if not rows:
        return
    cur.execute(
        queries.RUNS_LAPSE_UPDATE_LANE_RUN,
        {"l": row.name, "now": now},
    )
    freed = sum(r[1] for r in rows)
    if freed:
        cur.execute(queries.RUNS_LAPSE_UPDATE_LANE, {"f": freed, "l": row.name})
        row.finishing -= freed


def runs_of(cur: Cursor, lane: str, keys: list[str]) -> dict[str, int]:
    """The runs among ``keys`` that are under way or were (started): their current reserve."""
    if not keys:
        return {}
    params = {f"r{i}": k for i, k in enumerate(keys)}
    rows = cur.all(queries.runs_runs_of(params), {**params, "l": lane})
    return {r[0]: r[1] for r in rows}


def fits_of(cur: Cursor, lane: str, stages: list[str]) -> dict[str, StageFit]:
    """The profile's numbers for ``stages`` (stages never seen in a finished run are absent)."""
    if not stages:
        return {}
    params = {f"s{i}": s for i, s in enumerate(stages)}
    rows = cur.all(queries.runs_fits_of(params), {**params, "l": lane})
    return {r[0]: StageFit(r[1], r[2], r[3]) for r in rows}


def record(cur: Cursor, row: LaneRow, now: float, decision: Decision, fits: dict, started: set[str]) -> None:
    """Write the runs a tick admitted into: their stage, reserve and hold; flag the waiting jobs of new runs."""
    committed: dict[str, int] = {}
    for c in decision.admitted:
        if c.run_key is not None:
            committed[c.run_key] = committed.get(c.run_key, 0) + c.est
    rows = [
        {
            "l": row.name,
            "r": key,
            "now": now,
            "st": stage,
            "c": committed.get(key, 0),
            "rem": remaining,
            "exp": now + reserve_hold(row.policy, fits.get(stage)),
        }
        for key, remaining, stage in decision.runs
    ]
    cur.executemany(
        queries.RUNS_RECORD_INSERT_LANE_RUN,
        rows,
    )
    new = [{"l": row.name, "r": key, "t": True} for key, _, _ in decision.runs if key not in started]
    if new:  # their other waiting jobs now finish a run under way: the finishing head of the index
        cur.executemany(queries.RUNS_RECORD_UPDATE_JOB, new)


def refit(cur: Cursor, lane: str, now: float, *, force: bool = False) -> dict[str, StageFit] | None:
    """Learn the lane's profile from its latest lapsed runs and re-reserve the runs under way with it.

    Returns the stages fitted, or None if another process refit the lane less
    than ``REFIT_SECONDS`` ago (unless ``force``).
    """
    row = lock_lane(cur, lane)
    if not force and now - row.profile_at < REFIT_SECONDS:
        return None
    lapse(cur, row, now)
    jobs = cur.all(
        queries.RUNS_REFIT_SELECT_JOB,
        {"l": lane, "n": FIT_RUNS},
    )
    runs: dict[str, list] = {}
    for key, stage, est, actual, at in jobs:
        runs.setdefault(key, []).append((stage, run_tokens(est, actual), at))
    fitted = fit_runs(runs.values())
    if fitted:
        cur.executemany(
            queries.RUNS_REFIT_INSERT_RUN_PROFILE,
            [{"l": lane, "s": s, "a": f.after, "h": f.hold, "n": f.runs, "now": now} for s, f in fitted.items()],
        )
    cur.execute(
        queries.RUNS_REFIT_UPDATE_LANE_RUN,
        {"l": lane},
    )
    # The size classes of the order, from the lane's latest estimates (the head of ix_job_lane_created);
    # waiting jobs keep the place they were given, jobs placed from now on get the new boundary.
    ests = cur.all(queries.RUNS_LATEST_ESTIMATES, {"l": lane, "n": SIZE_CLASS_SAMPLE})
    # The drift allowance, from the lane's latest settlements (the head of ix_settlement_lane_at): an
    # estimate billed back for missing usage says nothing about how the estimates drift, nor does a late
    # settlement (stored with est 0: its estimate was released when its lease was reaped); nor does one an
    # operator cleared the allowance after (lanes.clear_drift: a range of the same index, never a scan).
    sql = queries.RUNS_DRIFT_SAMPLE if row.drift_cleared_at is None else queries.RUNS_DRIFT_SAMPLE_SINCE
    settled = cur.all(sql, {"l": lane, "n": DRIFT_SAMPLE, "c": row.drift_cleared_at})
    drift, overrun, spread = fit_drift(settled)
    cur.execute(
        queries.RUNS_REFIT_UPDATE_LANE,
        {"now": now, "l": lane, "b": size_class_boundary(e for (e,) in ests), "d": drift, "o": overrun, "s": spread},
    )
    if row.overtake_slack is not None:  # rule 12: Q from the day's arrivals, and the epochs nobody waits in
        overtake.refit(cur, lane, now, row.overtake_since, row.overtake_q)
    return fitted


def profile(cur: Cursor, lane: str) -> list[dict]:
    """The lane's learned profile, one dict per stage (``stage, after_tokens, hold_seconds, runs, fitted_at``)."""
    rows = cur.all(queries.RUNS_PROFILE, {"l": lane})
    return [dict(zip(queries.PROFILE_KEYS, r)) for r in rows]
