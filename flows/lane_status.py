"""Lane status where people look: a keyed ``lane-status`` table, % of ceiling, the parked counter.

Run it once (ephemeral Prefect is enough)::

    python flows/lane_status.py

or on a schedule from ``deployments/`` (every 5 minutes). Each run:

* writes the table artifact ``lane-status`` (spent / reserved / remaining /
  overage, % of ceiling, leased, waiting, **parked**) -- keyed, so the
  Artifacts page shows its history;
* writes one progress artifact per lane, ``lane-<name>-ceiling``: % of the
  ceiling committed (spent + reserved);
* emits an event only for a lane whose state changed since it was last told
  (e.g. "lane free crossed 80% of its ceiling", "lane free is admitting new
  runs again"), and ``lane.tail.high`` for each lane whose parked counter
  exceeds ``tail_alert``, for an Automation to page someone (see docs/scheduled-flows.md).
"""

from __future__ import annotations

from prefect import flow, get_run_logger

from lane_plugin import Ledger
from lane_plugin.gating.artifacts import publish_status, status_table
from lane_plugin.gating.events import publish_lane_states


@flow(name="lane-status", log_prints=True)
def lane_status(db: str | None = None, tail_alert: int | None = None) -> list[dict]:
    """Publish every lane's counters, % of ceiling and parked counter.

    Args:
        db: ledger URL or block (``block:lane-ledger/prod``); default ``LANE_DATABASE_URL``,
            else ``lane.db`` under PREFECT_HOME.
        tail_alert: emit ``lane.tail.high`` for a lane with more parked jobs than this.

    Returns:
        The rows of the ``lane-status`` table.
    """
    led = Ledger(db)
    get_run_logger().info("ledger: %s", led.url)
    try:
        status = led.lanes()
        changes = publish_lane_states(led)
    finally:
        led.close()
    published = publish_status(status, tail_alert=tail_alert)
    for r in status_table(status):
        print(
            f"lane {r['lane']}: {r['pct_of_ceiling']:.1f}% of ceiling, {r['waiting']} waiting, "
            f"{r['parked']} parked, {r['state']}"
        )
    for c in changes:
        get_run_logger().info("lane %s: %s -> %s", c["lane"], c["previous"] or "new", c["state"])
    if published["alerts"]:
        get_run_logger().warning("tail above %s parked in lanes %s", tail_alert, ", ".join(published["alerts"]))
    return status_table(status)


if __name__ == "__main__":
    lane_status()
