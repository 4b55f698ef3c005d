"""``track_limits(client)``: an openai or anthropic client whose every response tells the lane the provider's count.

A key shared with traffic outside the lane (another app, a notebook) makes the lane's windows
optimistic: it counts only what it admitted. The provider counts everything and says so on every
response (``x-ratelimit-limit-*`` / ``x-ratelimit-remaining-*``; Anthropic's
``anthropic-ratelimit-*-limit`` / ``-remaining``). :func:`track_limits` adds an httpx response hook to
the client that trues the lane's windows up to that count (:meth:`lane_plugin.Ledger.provider_used`, read
against what the lane had sent when the counted request, the body's gate's job, went out; the lane's own
charges never lowered), and closes the lane on a 429 the SDK would retry on its own
(:meth:`lane_plugin.Ledger.pause`), so every worker waits for the reset, not only this one. A request the
client is about to send while the lane is paused (its lease was granted before the pause, or it is the
SDK's own retry after the 429) waits for the reopen first, read in the request hook, the last moment before
it leaves, and read again every :data:`~lane_plugin.gating.ratelimits.PAUSE_STEP` while it waits: the
ledger's word wins over this process's memory of the 429 it heard, so a reopen written by any process ends
the wait. In a gated body on the same lane the send guard (:mod:`lane_plugin.gating.send_guard`) does both
already, later still (after the request hooks, before the response hooks): these hooks leave them to it.
"""

from __future__ import annotations

import time
from typing import Any

from ..checks import text
from ..errors import InvalidInput
from ..ledger import Ledger
from . import send_guard
from .current import current_gate
from .ratelimits import DEFAULT_PAUSE, MAX_PAUSE, PAUSE_STEP, remaining_of, wait_from_headers
from .shielded_log import shielded

log = shielded("lane_plugin.track_limits")  # its calls hold a Prefect timeout off: see shielded_log


def _http_client(client: Any) -> Any:
    """The httpx client under an openai/anthropic SDK client (``._client``), or an httpx client itself."""
    inner = getattr(client, "_client", client)
    if not hasattr(inner, "event_hooks"):
        raise InvalidInput(
            "client",
            client,
            f"track_limits needs an openai/anthropic client or an httpx client, not a {type(client).__name__}",
        )
    return inner


def track_limits(client: Any, lane: str = "free", *, ledger: Ledger | str | None = None) -> Any:
    """Make ``client``'s responses true ``lane``'s limits up to the provider's own count; returns ``client``.

    Args:
        client: an ``openai.OpenAI`` / ``AsyncOpenAI`` / ``anthropic.Anthropic`` / ``AsyncAnthropic`` client, or
            an ``httpx.Client`` / ``AsyncClient``.
        lane: the lane whose windows the key's limits are.
        ledger: the ledger (default: the gate's, ``LANE_DATABASE_URL``).

    Example:
        >>> client = track_limits(openai.OpenAI(max_retries=0), lane="free")   # doctest: +SKIP
    """
    lane = text("lane", lane)  # a name: a lane that does not exist is named in a warning at the first response
    http = _http_client(client)

    def seen(response: Any) -> None:
        try:
            headers = {str(k).lower(): str(v) for k, v in response.headers.items()}
            led = _ledger(ledger)
            if send_guard.heard_for(response) == lane:  # paused and trued up by the guard already
                return
            if response.status_code == 429:
                said = wait_from_headers(headers)
                seconds = min(max(said[0] if said else DEFAULT_PAUSE, 0.001), MAX_PAUSE)
                what = f"{said[1]} {headers.get(said[1], '')}".strip() if said else "no reset header"
                led.pause(lane, seconds, reason=f"a 429 seen by track_limits ({what})")
            used = remaining_of(headers)
            if used:  # counted at the request's arrival: compared with what the lane had sent by then
                gate = current_gate()
                led.provider_used(lane, used, job_id=getattr(gate, "job_id", None), refused=response.status_code == 429)
        except Exception as exc:  # the caller's request must never fail for the lane's bookkeeping
            log.warning("track_limits: lane %s not trued up: %s", lane, exc)

    def closed_for(request: Any) -> float:
        g = send_guard.guarding(request)
        if g is not None and g.lease.lane == lane:  # the guard holds it (the provider's request), after these hooks
            return 0.0
        try:
            return _ledger(ledger).paused_for(lane)
        except Exception as exc:  # never fail the request for the lane's bookkeeping
            log.warning("track_limits: could not read lane %s's pause: %s", lane, exc)
            return 0.0

    def before(request: Any) -> None:
        while (wait := closed_for(request)) > 0:  # read again each step: a reopen by any process ends the wait
            time.sleep(min(wait, PAUSE_STEP))

    if type(http).__name__.startswith("Async"):
        import asyncio

        async def hook(response: Any) -> None:
            await asyncio.to_thread(seen, response)

        async def abefore(request: Any) -> None:
            while (wait := await asyncio.to_thread(closed_for, request)) > 0:
                await asyncio.sleep(min(wait, PAUSE_STEP))

        http.event_hooks["request"].append(abefore)
        http.event_hooks["response"].append(hook)
    else:
        http.event_hooks["request"].append(before)
        http.event_hooks["response"].append(seen)
    return client


def _ledger(ledger: Ledger | str | None) -> Ledger:
    if isinstance(ledger, Ledger):
        return ledger
    from .ledgers import get_ledger

    return get_ledger(ledger)
