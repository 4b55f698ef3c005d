"""Upkeep as a Prefect flow, every minute: reap, park, expire, roll periods, publish status.

"Give every parked job a deadline and a visible counter." Each run, in order:

1. rolls every lane whose daily/monthly period ended (spent and overage reset);
2. reaps expired leases: back to the queue with attempt + 1, or parked when
   attempts are exhausted;
3. parks jobs still waiting past their admission deadline into the tail;
4. fails parked jobs whose tail deadline passed (event ``lane.job.expired``);
5. publishes lane status: table ``lane-status`` with the parked counter and a
   progress artifact per lane (% of ceiling committed), and an event for each
   lane whose state changed (e.g. "lane free is admitting new runs again").

Every ledger write is set-based and guarded by the state it expects, so two
copies running at once park each job exactly once. Per-job events
(``lane.job.parked``, ``lane.job.expired``) are capped at ``max_events`` per
run; the counts are always in the return value and in ``lane-status``.
"""

from __future__ import annotations

from prefect import flow, get_run_logger

from lane_plugin import Ledger
from lane_plugin.gating.artifacts import publish_status
from lane_plugin.gating.events import emit, publish_lane_states


@flow(name="park-overdue", log_prints=True)
def park_overdue(db: str | None = None, tail_alert: int | None = None, max_events: int = 500) -> dict:
    """Run one upkeep pass and publish the tail counter.

    Args:
        db: ledger URL or block (``block:lane-ledger/prod``); default ``LANE_DATABASE_URL``,
            else ``lane.db`` under PREFECT_HOME.
        tail_alert: emit ``lane.tail.high`` for a lane with more parked jobs than this.
        max_events: at most this many per-job events per run (a backlog of
            100,000 parked jobs must not become 100,000 events).

    Returns:
        ``{"rolled": [...], "requeued": n, "parked": n, "expired": n, "tail": total parked}``.
    """
    log = get_run_logger()
    led = Ledger(db)
    log.info("ledger: %s", led.url)
    try:
        rolled = led.roll_periods()
        moved = led.park_overdue()
        status = led.lanes()
        publish_lane_states(led)  # an event only for a lane whose state changed
    finally:
        led.close()
    for r in rolled:
        emit(
            "lane.lane.period-reset",
            r["lane"],
            {"period": r["period"], "period_start": r["period_start"], "previous": r["previous"]},
        )
    budget = max(0, int(max_events))
    for kind, jobs in (("lane.job.expired", moved.expired), ("lane.job.parked", moved.parked)):
        for job in jobs[:budget]:
            emit(kind, job["lane"], job)
        if len(jobs) > budget:
            log.warning("%s: %d jobs, events emitted for the first %d only", kind, len(jobs), budget)
        budget -= min(budget, len(jobs))
    published = publish_status(status, tail_alert=tail_alert)
    result = {
        "rolled": [r["lane"] for r in rolled],
        "requeued": len(moved.requeued),
        "parked": len(moved.parked),
        "expired": len(moved.expired),
        "tail": published["parked"],
    }
    print(
        f"requeued {result['requeued']}, parked {result['parked']}, expired {result['expired']}; "
        f"{result['tail']} in the tail" + (f"; periods reset in {', '.join(result['rolled'])}" if rolled else "")
    )
    return result


if __name__ == "__main__":
    park_overdue()
