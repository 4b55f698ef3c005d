"""The INFO lines a gated task run's own log carries: waiting (now and then), admitted, and settled.

Example (what a task run's log shows)::

    lane gate: draft job waiting 1.0s in lane 'free': estimate 1,204, remaining 0 of ceiling 8000000 (...)
    lane gate: draft admitted in lane 'free' after waiting 0.12s: estimate 1,204 tokens; 7,012,330 of 8,000,000 remaining; job 0f3c...
    lane gate: draft settled 1,311 tokens (estimate 1,204, drift 1.09, overage 107); job 0f3c...

The job id at the end is what ``lane status JOB`` and the ledger's tables know the run's job by.
"""

from __future__ import annotations

import logging

from ..cli_text import why_waiting
from ..ledger import Ledger, Settled


def waiting(logger, led: Ledger, *, stage: str, job_id: str, waited: float) -> None:
    """Log where a waiting job stands at INFO (:meth:`Ledger.wait_status`: a few reads, only when logged).

    Nothing is read when INFO is off: a thousand waiters that started together would otherwise all read
    their queue position at the same moments (after 1 s, then every 10 s), for lines nobody sees. A job
    that is no longer waiting when the line is written (leased by a tick its waiter has not seen yet,
    or parked) is said to be so, never given a place in a queue it has left.
    """
    if hasattr(logger, "isEnabledFor") and not logger.isEnabledFor(logging.INFO):
        return
    s = led.wait_status(job_id)
    if s["state"] != "new":
        logger.info("lane gate: %s", left_queue(s, stage=stage, waited=waited))
        return
    logger.info(
        "lane gate: %s job waiting %.1fs in lane %r: estimate %d, remaining %d of ceiling %d "
        "(spent %d, reserved %d), position %d of %d waiting, leased %d/%d, %s",
        stage,
        waited,
        s["lane"],
        s["est"],
        s["remaining"],
        s["ceiling"],
        s["spent"],
        s["reserved"],
        s["position"],
        s["waiting"],
        s["leased"],
        s["max_leased"],
        why_waiting(s),
    )


def left_queue(s: dict, *, stage: str, waited: float) -> str:
    """A waiting gate's job that left the queue (``s``: its :meth:`Ledger.wait_status`), in words.

    Example:
        >>> left_queue({"state": "leased", "lane": "free", "attempt": 1, "reason": None}, stage="draft", waited=1.04)
        "draft job leased in lane 'free' after waiting 1.0s (attempt 1): its body starts as its waiter picks it up"
        >>> left_queue({"state": "parked", "lane": "free", "attempt": 1, "reason": "deadline passed while waiting"},
        ...            stage="draft", waited=30.2)
        "draft job parked in lane 'free' after waiting 30.2s: deadline passed while waiting"
    """
    if s["state"] == "leased":
        return (
            f"{stage} job leased in lane {s['lane']!r} after waiting {waited:.1f}s (attempt {s['attempt']}): "
            "its body starts as its waiter picks it up"
        )
    why = s["reason"] or "no reason recorded"
    return f"{stage} job {s['state']} in lane {s['lane']!r} after waiting {waited:.1f}s: {why}"


def admitted(
    logger,
    led: Ledger,
    *,
    stage: str,
    lane: str,
    est: int,
    waited: float,
    attempt: int,
    job_id: str,
    asked: str | None = None,
) -> None:
    """Log the admission at INFO, with the lane's room left after it (one extra read, only when logged).

    ``asked``: the lane the gate asked for; a job admitted in another (its fallback) says so.
    """
    if hasattr(logger, "isEnabledFor") and not logger.isEnabledFor(logging.INFO):
        return
    try:
        row = led.lane(lane)
        room = f"; {row.remaining:,} of {row.ceiling:,} remaining"
    except Exception:  # the line must never fail a run
        room = ""
    again = f", attempt {attempt}" if attempt > 1 else ""
    moved = f" (the fallback of lane {asked!r})" if asked is not None and asked != lane else ""
    logger.info(
        "lane gate: %s admitted in lane %r%s after waiting %.2fs: estimate %s tokens%s%s; job %s",
        stage,
        lane,
        moved,
        waited,
        f"{est:,}",
        room,
        again,
        job_id,
    )


def settled(logger, s: Settled, *, stage: str, est: int) -> None:
    """Log the settlement at INFO: actual, drift against the estimate, overage, and late / by estimate."""
    if s.replay:
        return
    notes = []
    if s.by_estimate:
        notes.append("billed by estimate: no usage was found")
    if s.late:
        notes.append("late: its lease had expired, billed anyway")
    if s.outcome == "failed":
        notes.append("the attempt failed")
    drift = f"{s.actual / est:.2f}" if est else "-"
    logger.info(
        "lane gate: %s settled %s tokens (estimate %s, drift %s, overage %s)%s; job %s",
        stage,
        f"{s.actual:,}",
        f"{est:,}",
        drift,
        f"{s.overage:,}",
        "; " + "; ".join(notes) if notes else "",
        s.job_id,
    )


__all__ = ["admitted", "left_queue", "settled", "waiting"]
