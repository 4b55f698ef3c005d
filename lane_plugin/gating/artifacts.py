"""Publishing the ledger to Prefect: keyed artifacts and ``lane.*`` events (used by flows/).

Artifact keys are stable, so the Artifacts page shows each one's history:
``lane-status`` (table), ``lane-<name>-ceiling`` (progress: % of the ceiling
committed), ``lane-drift`` (table), ``lane-drift-summary`` (markdown),
``lane-drift-plot`` (markdown with the image). The flow run's own bill,
``lane-bill``, is published by :mod:`lane_plugin.gating.bill`. Lane status is
not an event every run: only a change of a lane's state is
(:func:`~lane_plugin.gating.events.publish_lane_states`).
"""

from __future__ import annotations

import re

from prefect.artifacts import create_progress_artifact, create_table_artifact

from ..ledger.status import blocked_state
from .events import emit, stage_resource

STATUS_COLUMNS = (
    "lane",
    "ceiling",
    "spent",
    "reserved",
    "remaining",
    "overage",
    "pct_of_ceiling",
    "leased",
    "max_leased",
    "waiting",
    "parked",
    "state",
)


def artifact_key(*parts: str) -> str:
    """A Prefect artifact key (lowercase letters, digits, dashes) from free text.

    Example:
        >>> artifact_key("lane", "Free_Tier", "ceiling")
        'lane-free-tier-ceiling'
    """
    return re.sub(r"-+", "-", re.sub(r"[^a-z0-9-]", "-", "-".join(parts).lower())).strip("-")


def _state(s: dict) -> str:
    if s["stopped"]:
        return "STOPPED"
    if s["hard_stopped"]:
        return "ceiling-spent (hard stop)"  # lane status's word for it
    if not s["preflight_ok"]:
        return f"preflight failed: {s['preflight_error']}"
    if s["starting_stopped"]:
        return "finishing only (start limit reached)"
    return blocked_state(s) or "ok"


def status_table(status: list[dict]) -> list[dict]:
    """The rows of the ``lane-status`` table."""
    return [{**{k: s[k] for k in STATUS_COLUMNS if k in s}, "state": _state(s)} for s in status]


def publish_status(status: list[dict], *, tail_alert: int | None = None) -> dict:
    """Publish lane status as keyed artifacts and events (inside a flow run).

    Returns ``{"parked": total parked, "alerts": [lanes over tail_alert]}``.
    """
    rows = status_table(status)
    parked = sum(r["parked"] for r in rows)
    waiting = sum(r["waiting"] for r in rows)
    create_table_artifact(
        table=rows,
        key="lane-status",
        description=f"**{parked} parked** (tail), {waiting} waiting across {len(rows)} lanes. "
        "pct_of_ceiling = (spent + reserved) / ceiling.",
    )
    alerts = []
    for s in status:
        pct = max(0.0, min(100.0, float(s["pct_of_ceiling"])))
        create_progress_artifact(
            progress=pct,
            key=artifact_key("lane", s["lane"], "ceiling"),
            description=f"lane {s['lane']}: {s['spent'] + s['reserved']:,} of {s['ceiling']:,} tokens committed "
            f"(spent {s['spent']:,}, reserved {s['reserved']:,}); {s['parked']} parked",
        )
        if tail_alert is not None and s["parked"] > tail_alert:
            alerts.append(s["lane"])
            emit("lane.tail.high", s["lane"], {"parked": s["parked"], "threshold": tail_alert})
    return {"parked": parked, "alerts": alerts}


def drift_table(report) -> list[dict]:
    """A drift report frame as JSON-safe rows for a table artifact."""
    import json

    return json.loads(report.to_json(orient="records"))


def publish_drift(report, summary: str, *, plot: str | None = None, high: float = 1.5) -> list[dict]:
    """Publish a drift report: table ``lane-drift``, markdown ``lane-drift-summary``, plot, events.

    The plot (a PNG path) is embedded in the markdown artifact ``lane-drift-plot``
    as a data URI, so it shows without any file server. Emits
    ``lane.drift.high`` for each admission row whose drift is above ``high``;
    returns those rows.
    """
    import base64
    import os

    from prefect.artifacts import create_markdown_artifact

    rows = drift_table(report)
    create_table_artifact(
        table=rows,
        key="lane-drift",
        description="Drift = sum(actual) / sum(est) of done jobs, per group; "
        "near 1.0 honest, above 1.5 overspending; under / overspend / p99 / by_estimate "
        "show what the sum hides.",
    )
    create_markdown_artifact(markdown=summary, key="lane-drift-summary", description="Worst stage and what to do")
    if plot and os.path.exists(plot):
        with open(plot, "rb") as fh:
            data = base64.b64encode(fh.read()).decode("ascii")
        create_markdown_artifact(
            markdown=f"![drift per stage and budget over time](data:image/png;base64,{data})",
            key="lane-drift-plot",
            description="Drift per stage over time with the 1.0 and 1.5 lines; below it, each lane's spend as % "
            "of its ceiling with the ceiling and start-limit lines",
        )
    high_rows = [
        r for r in rows if r.get("role", "admission") == "admission" and r["drift"] is not None and r["drift"] > high
    ]
    for r in high_rows:
        stage = str(r.get("stage", "-"))
        emit(
            "lane.drift.high",
            stage_resource(stage, str(r["lane"]) if r.get("lane") else None),
            {**r, "threshold": high},
        )
    return high_rows
