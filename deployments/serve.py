"""Serve the lane plugin's scheduled flows from one process (no work pool, no worker).

From the repository root, against a running ``prefect server start``::

    python deployments/serve.py

serves ``drift-report/drift-report`` (hourly), ``park-overdue/park-overdue``
(every minute) and ``lane-status/lane-status`` (every 5 minutes): the same
names and schedules as ``deployments/prefect.yaml``. ``--only drift-report``
serves a subset; ``--no-schedule`` serves them for manual / triggered runs
only. Stop with Ctrl-C (the schedules are paused on shutdown).

The ledger is the one every entry point uses: ``LANE_DATABASE_URL`` (a URL or
``block:lane-ledger/NAME``), else ``lane.db`` under ``PREFECT_HOME``.

Going from ``prefect.yaml`` + a worker to this script: a deployment of the same
name that belongs to a work pool cannot be served from here (Prefect would keep
its worker-side settings, and every run would crash with "Downloading flow code
from storage at None"). This script refuses, naming them; ``--take-over``
deletes those deployments first and says so. Going back is plain: stop this
script and run ``prefect deploy --all --prefect-file deployments/prefect.yaml``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from prefect.flows import load_flow_from_entrypoint

FLOWS = Path(__file__).resolve().parents[1] / "flows"
SCHEDULES = {  # flow name = deployment name -> (entrypoint in flows/, interval seconds, default parameters)
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
            name=name, interval=every if schedule else None, parameters=params, tags=["lane"],
            concurrency_limit=ConcurrencyLimitConfig(limit=1, collision_strategy=ConcurrencyLimitStrategy.CANCEL_NEW),
        ))  # fmt: skip
    return out


def pooled(deps: list) -> list[tuple[str, str]]:
    """``(flow/deployment, work pool)`` of the deployments we would serve that belong to a work pool."""
    from prefect import get_client
    from prefect.exceptions import ObjectNotFound

    found = []
    with get_client(sync_client=True) as client:
        for d in deps:
            full = f"{d.flow_name}/{d.name}"
            try:
                existing = client.read_deployment_by_name(full)
            except ObjectNotFound:
                continue
            if existing.work_pool_name:
                found.append((full, existing.work_pool_name))
    return found


def take_over(names: list[str]) -> None:
    from prefect import get_client

    with get_client(sync_client=True) as client:
        for full in names:
            client.delete_deployment(client.read_deployment_by_name(full).id)
            print(f"serve.py: deleted deployment {full} (it belonged to a work pool); serving it from here")


def refusal(found: list[tuple[str, str]]) -> str:
    names = ", ".join(f"{n} (work pool {p})" for n, p in found)
    deletes = " && ".join(f"prefect deployment delete {n}" for n, _ in found)
    return (
        f"serve.py: {names} already deployed to a work pool by prefect deploy. Serving the same name from here "
        "would crash every run ('Downloading flow code from storage at None'). Either keep the worker "
        f"(prefect worker start --pool {found[0][1]}), or switch to serving: rerun with --take-over, "
        f"or delete them first: {deletes}"
    )


def main(argv: list[str] | None = None) -> None:
    from prefect import serve

    ap = argparse.ArgumentParser(description="Serve the lane plugin's scheduled flows.")
    ap.add_argument("--only", action="append", choices=sorted(SCHEDULES), help="serve only this flow (repeatable)")
    ap.add_argument("--no-schedule", action="store_true", help="no schedules: runs only when triggered")
    ap.add_argument("--limit", type=int, default=None, help="at most this many runs at once")
    ap.add_argument("--take-over", action="store_true",
                    help="delete deployments of the same names that belong to a work pool, then serve them")  # fmt: skip
    args = ap.parse_args(argv)
    deps = deployments(args.only, schedule=not args.no_schedule)
    found = pooled(deps)
    if found and not args.take_over:
        raise SystemExit(refusal(found))
    if found:
        take_over([n for n, _ in found])
    serve(*deps, limit=args.limit)


if __name__ == "__main__":
    main()
