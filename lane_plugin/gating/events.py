"""Ledger events as Prefect events, so that people can read them and Automations can page: the one path.

Job events come from the ledger through :class:`PrefectListener` (one per
ledger the gate uses); the scheduled flows publish theirs; everything goes
through :func:`emit`. The resource is the lane (``lane.<name>``), or a stage
(``lane.stage.<name>``) for drift; inside a task run Prefect attaches the task
run and flow run as related resources.

Job events: ``lane.job.admitted``, ``lane.job.settled``, ``lane.job.parked``,
``lane.job.expired``; their resource carries the job's numbers as labels
(``lane.stage``, ``lane.estimate``, ``lane.tenant`` when the job's lease says it, and ``lane.actual``,
``lane.overage`` once settled), and a related resource with the role ``lane-tokens`` whose id reads them
(``lane.tokens: free: draft, estimate 1,200 tokens, actual 1,340``): the UI's event card shows it.

Lane state events are sent only when a lane's state changes (see
:meth:`Ledger.report_lane_states`: each change is told once, by whichever
process sees it first), and are named in words, which is what the Prefect UI
shows as their title: ``lane.free.crossed-80%-of-its-ceiling`` reads "Lane free
crossed 80% of its ceiling". Their resource has the label ``lane.state``
(``finishing-only``, ``ceiling-spent``, ``stopped``, ``preflight-failed``,
``ok``) for Automations to match (``expect: ["lane.*"]``, ``match:
{"lane.state": "finishing-only"}``). Also: ``lane.lane.period-reset``,
``lane.tail.high``, ``lane.drift.high`` and ``lane.paused`` (a provider's 429 closed the lane until ``until``:
:meth:`Ledger.pause`).

Example:
    >>> state_title({"lane": "free", "state": "finishing-only", "start_fraction": 0.8})
    'lane free crossed 80% of its ceiling'
"""

from __future__ import annotations

import math
from typing import Any

from .shielded_log import shielded

log = shielded("lane_plugin.events")  # its calls hold a Prefect timeout off: see shielded_log


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


def may_emit() -> bool:
    """Is there a Prefect API to send events to? A configured ``PREFECT_API_URL``, or a Prefect run
    (whose engine already serves one). Outside a run with no API the gate emits nothing: Prefect would
    start an ephemeral server per process for it, which can outlive the process."""
    try:
        from prefect.context import FlowRunContext, TaskRunContext
        from prefect.settings import PREFECT_API_URL

        return bool(PREFECT_API_URL.value()) or FlowRunContext.get() is not None or TaskRunContext.get() is not None
    except Exception:
        return False


def emit(event: str, about: str | dict, payload: dict | None = None, related: list[dict] | None = None) -> None:
    """Emit one Prefect event about a lane (a name) or another resource (a dict); never raises.

    The ledger's writes are committed before an event is sent: a failed emit is
    logged, never raised, so it cannot undo a run. With no Prefect API to send to
    (:func:`may_emit`) nothing is sent.
    """
    if not may_emit():
        log.debug("no Prefect API (PREFECT_API_URL unset, outside a run): event %s not sent", event)
        return
    try:
        from prefect.events import emit_event

        res = resource(about) if isinstance(about, str) else about
        emit_event(event=event, resource=res, payload=_plain(dict(payload or {})), related=related)
    except Exception:
        log.warning("could not emit Prefect event %s about %s", event, about, exc_info=True)


_JOB_LABELS = (
    ("stage", "lane.stage"),
    ("est", "lane.estimate"),
    ("actual", "lane.actual"),
    ("overage", "lane.overage"),
    ("attempt", "lane.attempt"),
    ("job_id", "lane.job"),
    ("tenant", "lane.tenant"),
)
# Ledger events that may change a lane's state: each makes the listener look (rare: at crossings).
_LANE_EVENTS = ("lane.lane.start-stop", "lane.lane.hard-stop", "lane.preflight.failed", "lane.lane.period-reset")


def job_resource(lane: str, payload: dict) -> dict[str, str]:
    """The lane resource of a job event, with the job's numbers as labels (for Automations and the API)."""
    out = resource(lane)
    for key, label in _JOB_LABELS:
        if payload.get(key) is not None:
            out[label] = str(payload[key])
    return out


def job_card(lane: str, payload: dict) -> dict[str, str]:
    """The related resource that puts a job's tokens on the Prefect UI's event card.

    The card shows a resource of a type it does not know by its id alone (not by its
    name or labels: checked in headless Chromium on Prefect 3.9's UI), so the numbers
    are the id of a related resource with the role ``lane-tokens``.

    Example:
        >>> job_card("free", {"stage": "draft", "est": 1200, "actual": 1340})["prefect.resource.id"]
        'lane.tokens: free: draft, estimate 1,200 tokens, actual 1,340'
    """
    return {"prefect.resource.id": f"lane.tokens: {job_title(lane, payload)}", "prefect.resource.role": "lane-tokens"}


def job_title(lane: str, payload: dict) -> str:
    """What a job event's card reads: lane, stage, estimate and (once settled) actual tokens."""
    words = [f"{lane}: {payload['stage']}" if payload.get("stage") else lane]
    if isinstance(payload.get("est"), int):
        words.append(f"estimate {payload['est']:,} tokens")
    if isinstance(payload.get("actual"), int):
        words.append(f"actual {payload['actual']:,}")
    return ", ".join(words)


def _pct(fraction: float) -> str:
    return f"{round(float(fraction) * 100, 1):g}%"


def state_title(change: dict) -> str:
    """A lane state change in words, e.g. ``lane free crossed 80% of its ceiling``."""
    lane, state = change["lane"], change["state"]
    if state == "finishing-only":
        return f"lane {lane} crossed {_pct(change.get('start_fraction', 0.8))} of its ceiling"
    words = {
        "ceiling-spent": "spent its whole ceiling",
        "stopped": "was stopped",
        "preflight-failed": "failed its preflight check",
        "ok": "is admitting new runs again",
    }
    return f"lane {lane} {words.get(state, 'is ' + state)}"


def state_event_name(change: dict) -> str:
    """The event name whose UI title is :func:`state_title`: ``lane.free.crossed-80%-of-its-ceiling``."""
    words = state_title(change).split(" ", 2)[2]
    return f"lane.{change['lane']}.{words.replace(' ', '-')}"


def publish_lane_states(ledger, lane: str | None = None) -> list[dict]:
    """Emit one event per lane whose state changed since it was last told; returns the changes."""
    changes = ledger.report_lane_states(lane)
    for c in changes:
        res = {**resource(c["lane"]), "lane.state": c["state"], "lane.previous-state": c["previous"] or "none"}
        emit(state_event_name(c), res, {**c, "title": state_title(c)})
    return changes


class PrefectListener:
    """A :class:`~lane_plugin.Ledger` listener: job events to Prefect, lane changes as state events."""

    def __init__(self, ledger=None):
        self.ledger = ledger

    def __call__(self, event: str, lane: str, payload: dict) -> None:
        if event in _LANE_EVENTS:
            if event == "lane.lane.period-reset":
                emit(event, lane, payload)
            if self.ledger is not None:
                try:
                    publish_lane_states(self.ledger, lane)
                except Exception:
                    log.warning("could not publish the state of lane %s", lane, exc_info=True)
            return
        if event.startswith("lane.job."):
            emit(event, job_resource(lane, payload), payload, related=[job_card(lane, payload)])
        else:
            emit(event, lane, payload)


prefect_listener = PrefectListener()  # job events only: a ledger-less listener cannot read lane states


__all__ = [
    "PrefectListener",
    "emit",
    "job_card",
    "job_resource",
    "job_title",
    "may_emit",
    "prefect_listener",
    "publish_lane_states",
    "resource",
    "stage_resource",
    "state_event_name",
    "state_title",
]
