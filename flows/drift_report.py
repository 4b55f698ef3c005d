"""The drift report as a Prefect flow: "read drift, not totals".

Each run computes drift per stage (``sum(actual) / sum(est)`` of done jobs, the
article's definition) and publishes:

* table artifact ``lane-drift`` -- jobs, est_tokens, actual_tokens, drift, p50,
  p90, overage_tokens and verdict per group, and what a sum hides: under (share
  of jobs under-estimated), overspend (tokens beyond estimates / actual), p99,
  by_estimate (jobs billed their estimate, usage missing), rate_cost_set;
* markdown artifact ``lane-drift-summary`` -- the worst overspender and what to
  do ("fix the estimator before you touch the ceiling"), comparing shadow
  estimator versions on the same jobs when there are any, then how to read it;
* markdown artifact ``lane-drift-plot`` -- drift per stage over time with the
  1.0 and 1.5 lines, and each lane's spend as % of its ceiling with the ceiling
  and start-limit lines (the PNG is also left at ``plot``);
* event ``lane.drift.high`` for each stage above 1.5.

It also refits the learned estimators (``refit=True``): each stage's output
allowance is learned again from the newest settled jobs and stored in the
ledger, where every process estimating with ``learned()`` reads it
(:func:`lane_plugin.estimators.refit_all`; ``lane estimators refit`` on demand).

Run once: ``python flows/drift_report.py``; hourly: see ``deployments/``.
"""

from __future__ import annotations

import os
from pathlib import Path

from prefect import flow, get_run_logger

from lane_plugin import Ledger
from lane_plugin.gating.artifacts import publish_drift
from lane_plugin.reports import HIGH, drift, drift_over_time, render, spend_over_time, summary_markdown


def default_plot_path() -> str:
    """``drift.png`` under ``$PREFECT_HOME/lane-reports`` (``~/.prefect`` by default)."""
    home = os.environ.get("PREFECT_HOME") or str(Path.home() / ".prefect")
    return str(Path(home).expanduser() / "lane-reports" / "drift.png")


@flow(name="drift-report", log_prints=True)
def drift_report(
    db: str | None = None,
    lane: str | None = None,
    since: str | None = "24h",
    by: str = "stage",
    plot: str | None = None,
    high: float = HIGH,
    refit: bool = True,
) -> list[dict]:
    """Compute and publish the drift report.

    Args:
        db: ledger URL or block (``block:lane-ledger/prod``); default ``LANE_DATABASE_URL``,
            else ``lane.db`` under PREFECT_HOME.
        lane: only this lane.
        since: only jobs finished within this span (``24h``); None for all time.
        by: group columns for the ``lane-drift`` table (``stage``, ``lane``,
            ``est_version``, ``version``), comma separated.
        plot: where to write the PNG (default ``$PREFECT_HOME/lane-reports/drift.png``);
            ``""`` for no plot.
        high: the drift above which ``lane.drift.high`` is emitted.
        refit: refit the learned estimators' state in the ledger too.

    Returns:
        The ``lane-drift`` table's rows.
    """
    from lane_plugin.estimators import refit_all
    from lane_plugin.gating.artifacts import drift_table
    from lane_plugin.reports import plot_drift

    log = get_run_logger()
    led = Ledger(db)
    log.info("ledger: %s", led.url)
    try:
        for r in refit_all(led, lane=lane) if refit else []:
            for line in r.lines():
                log.info("refit %s %s", r.estimator, line)
            log.info("refit %s: %s", r.estimator, r.outcome())
        report = drift(led, lane=lane, since=since, by=by)
        versions = drift(led, lane=lane, since=since, by="stage,version")
        path = None
        if plot != "":
            path = plot_drift(
                drift_over_time(led, lane=lane, since=since),
                plot or default_plot_path(),
                spend=spend_over_time(led, lane=lane, since=since),
            )
    finally:
        led.close()
    summary = summary_markdown(
        versions, title="Lane drift" + (f" in lane {lane}" if lane else ""), since=since, ledger=str(led.url)
    )
    high_rows = publish_drift(report, summary, plot=path, high=high)
    print(render(report, "table") if not report.empty else f"no settled jobs in the ledger at {led.url}")
    for r in high_rows:
        log.warning(
            "stage %s drift %.2f > %s: fix the estimator before you touch the ceiling", r.get("stage"), r["drift"], high
        )
    return drift_table(report)


if __name__ == "__main__":
    drift_report()
