"""Ledger events as Prefect events, so that an Automation can page someone.

The ledger calls its listeners after each commit with ``(event, lane, payload)``;
:func:`prefect_listener` forwards them with :func:`prefect.events.emit_event`.
The resource is the lane (``lane.<name>``); when the event is emitted inside a
task run, Prefect attaches the task run and flow run as related resources.

Event names: ``lane.job.admitted``, ``lane.job.settled``, ``lane.job.parked``,
``lane.job.expired``, ``lane.lane.start-stop`` (the start limit, 80% of the
ceiling by default, was crossed), ``lane.lane.hard-stop`` (the ceiling is spent)
and ``lane.preflight.failed``.

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


def prefect_listener(event: str, lane: str, payload: dict) -> None:
    """Emit one ledger event to Prefect; never raises (a failed emit is logged)."""
    try:
        from prefect.events import emit_event

        emit_event(event=event, resource=resource(lane), payload=_plain(dict(payload or {})))
    except Exception:  # the ledger write is committed: an event must never undo it
        log.warning("could not emit Prefect event %s for lane %s", event, lane, exc_info=True)


__all__ = ["prefect_listener", "resource"]
