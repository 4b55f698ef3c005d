"""Serve the lane plugin's scheduled flows from one process (no work pool, no worker).

From the repository root, against a running ``prefect server start``::

    LANE_DATABASE_URL=sqlite:///$PWD/lane.db python deployments/serve.py

serves ``drift-report/lane-ops`` (hourly), ``park-overdue/lane-ops`` (every
minute) and ``lane-status/lane-ops`` (every 5 minutes), the same names and
schedules as ``deployments/prefect.yaml``. ``--only drift-report`` serves a
subset; ``--no-schedule`` serves them for manual / triggered runs only.
Stop with Ctrl-C (the schedules are paused on shutdown).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from prefect.flows import load_flow_from_entrypoint

FLOWS = Path(__file__).resolve().parents[1] / "flows"
NAME = "lane-ops"
SCHEDULES = {  # flow name -> (entrypoint in flows/, interval seconds, default parameters)
    "drift-report": ("drift_report.py:drift_report", 3600, {"since": "24h", "by": "stage"}),
    "park-overdue": ("park_overdue.py:park_overdue", 60, {"tail_alert": 100, "max_events": 500}),
    "lane-status": ("lane_status.py:lane_status", 300, {"tail_alert": 100}),
}


def deployments(only: list[str] | None = None, *, schedule: bool = True) -> list:
    """The RunnerDeployments to serve (all of them, or those named in ``only``)."""
    from prefect.client.schemas.objects import ConcurrencyLimitConfig, ConcurrencyLimitStrategy

    unknown = sorted(set(only or ()) - set(SCHEDULES))
    if unknown:
        raise SystemExit(f"serve.py: unknown flow {', '.join(unknown)}; expected {', '.join(SCHEDULES)}")
    out = []
    for name, (entrypoint, every, params) in SCHEDULES.items():
        if only and name not in only:
            continue
        flow = load_flow_from_entrypoint(f"{FLOWS / entrypoint}", use_placeholder_flow=False)
        out.append(flow.to_deployment(
            name=NAME, interval=every if schedule else None, parameters=params, tags=["lane"],
            concurrency_limit=ConcurrencyLimitConfig(limit=1, collision_strategy=ConcurrencyLimitStrategy.CANCEL_NEW),
        ))  # fmt: skip
    return out


def main(argv: list[str] | None = None) -> None:
    from prefect import serve

    ap = argparse.ArgumentParser(description="Serve the lane plugin's scheduled flows.")
    ap.add_argument("--only", action="append", choices=sorted(SCHEDULES), help="serve only this flow (repeatable)")
    ap.add_argument("--no-schedule", action="store_true", help="no schedules: runs only when triggered")
    ap.add_argument("--limit", type=int, default=None, help="at most this many runs at once")
    args = ap.parse_args(argv)
    serve(*deployments(args.only, schedule=not args.no_schedule), limit=args.limit)


if __name__ == "__main__":
    main()
