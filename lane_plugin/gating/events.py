"""Ledger events as Prefect events, so that an Automation can page someone: the one path.

The ledger calls its listeners after each commit with ``(event, lane, payload)``;
:func:`prefect_listener` forwards them, and the scheduled flows publish theirs,
through :func:`emit`. The resource is the lane (``lane.<name>``), or a stage
(``lane.stage.<name>``) for drift; inside a task run Prefect attaches the task
run and flow run as related resources.

Event names: ``lane.job.admitted``, ``lane.job.settled``, ``lane.job.parked``,
``lane.job.expired``, ``lane.lane.start-stop`` (the start limit, 80% of the
ceiling by default, was crossed), ``lane.lane.hard-stop`` (the ceiling is spent),
``lane.lane.period-reset``, ``lane.preflight.failed``, ``lane.lane.status``,
``lane.tail.high`` and ``lane.drift.high``.

Example:
    >>> from lane_plugin import Ledger
    >>> Ledger(listeners=[prefect_listener])                   # doctest: +SKIP
"""

from __future__ import annotations

import logging
import math
from typing import Any

log = logging.getLogger("lane_plugin.events")


def resource(lane: str) -> dict[str, str]:
    """The Prefect resource that names a lane: ``{"prefect.resource.id": "lane.<lane>", ...}``."""
    return {"prefect.resource.id": f"lane.{lane}", "prefect.resource.name": lane, "lane.name": lane}


def stage_resource(stage: str, lane: str | None = None) -> dict[str, str]:
    """The Prefect resource that names a pipeline stage (drift is per stage)."""
    out = {"prefect.resource.id": f"lane.stage.{stage}", "prefect.resource.name": stage, "lane.stage": stage}
    if lane:
        out["lane.name"] = lane
    return out


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return str(value)


def emit(event: str, about: str | dict, payload: dict | None = None) -> None:
    """Emit one Prefect event about a lane (a name) or another resource (a dict); never raises.

    The ledger's writes are committed before an event is sent: a failed emit is
    logged, never raised, so it cannot undo a run.
    """
    try:
        from prefect.events import emit_event

        res = resource(about) if isinstance(about, str) else about
        emit_event(event=event, resource=res, payload=_plain(dict(payload or {})))
    except Exception:
        log.warning("could not emit Prefect event %s about %s", event, about, exc_info=True)


def prefect_listener(event: str, lane: str, payload: dict) -> None:
    """A :class:`~lane_plugin.Ledger` listener forwarding every ledger event to Prefect."""
    emit(event, lane, payload)


__all__ = ["emit", "prefect_listener", "resource", "stage_resource"]
