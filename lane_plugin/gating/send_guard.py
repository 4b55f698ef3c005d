"""The send guard: inside a gated body, a provider's 429 closes the lane the moment httpx has it, and a request
about to leave while the lane is closed waits for the reopen instead of being sent.

The gate's own check runs before the body (:meth:`ProviderPause._paused_for`), and a 429 reaches the gate
only when the SDK raises it, 1-8 ms after its answer arrived (longer on a loaded machine, and never while the
SDK retries on its own). A request another worker of the process begins in that gap goes out into the window
the 429 closed. The guard closes the gap where every request of the openai and anthropic SDKs passes: httpx's
``Client._send_single_request`` / ``AsyncClient._send_single_request`` (after the client's request hooks,
before its response hooks), in ``httpx`` and in its fork ``httpx2`` (which openai 3.x and anthropic 2.x send
through), patched once per process by the first gate to reach its body. It acts only in a
gated body (:func:`lane_plugin.current_gate`; a thread the body starts carries no gate unless it runs in a copy
of the body's context); elsewhere a request passes untouched. For each request of a gated body:

1. before it is sent: while the gate's lane is paused (this process's memory of the pause first, then the
   ledger's row: another process's 429) or another gate's probe is out after a pause, it waits (the lease
   renewed meanwhile), then goes; its charges count from then. A request the SDK retries on its own after a
   429 waits the same way, so the SDK's retries keep working: a held send waits, it never fails.
2. once its answer is in: a 429 pauses the lane for as long as its headers say (:func:`wait_from_headers`),
   in this process's memory at once and then in the ledger for every process, before the SDK sees the
   response; any other answer to the probe after a pause reopens the lane.

Reading ``x-ratelimit-remaining-*`` on every response to see spend outside the lane stays
:func:`lane_plugin.track_limits`' (opt-in). ``LANE_SEND_GUARD=false`` turns the guard off (the check before
the body and the pause on the SDK's error remain).
"""

from __future__ import annotations

from typing import Any

from ..settings import lane_settings
from .current import current_gate
from .shielded_log import shielded

log = shielded("lane_plugin.send_guard")  # its calls hold a Prefect timeout off: see shielded_log
_installed = False
# The attribute set on an httpx response whose 429 the guard has written as the lane's pause: the gate's own
# handling of the SDK's error, and track_limits' response hook, do not pause the lane (and count the job's
# 429) a second time.
HEARD = "_lane_plugin_paused"


def guarding() -> Any:
    """The gate whose sends the guard watches here: the running gate, admitted, with the guard on; else None."""
    g = current_gate()
    if not _installed or g is None or getattr(g, "lease", None) is None or not hasattr(g, "_hold_send"):
        return None
    if not lane_settings().send_guard:
        return None
    return g


# The httpx packages the SDKs send through: httpx, and its fork httpx2 (anthropic 2.x and openai 3.x use it).
PACKAGES = ("httpx", "httpx2")


def install() -> bool:
    """Patch each httpx package there is, once per process (idempotent, cheap after the first call); False if
    none could be patched."""
    global _installed
    # No lock: the first gate to reach its body installs it, in a thread a Prefect timeout may interrupt at any
    # bytecode (a `with lock:` can be left held at its exit line). Two threads patching at once both wrap the
    # original send (each reads it before either writes), and a later call sees a wrapper and leaves it.
    if not _installed:
        _installed = bool([name for name in PACKAGES if _patch(name)])
    return _installed


def _patch(package: str) -> bool:
    import importlib

    try:
        httpx = importlib.import_module(package)
    except ImportError:  # not installed: nothing of it to guard
        return False
    sync_send = getattr(httpx.Client, "_send_single_request", None)
    async_send = getattr(httpx.AsyncClient, "_send_single_request", None)
    if sync_send is None or async_send is None:
        version = getattr(httpx, "__version__", "?")
        what = "lane send guard: %s %s has no _send_single_request: not installed (the SDK's error pauses the lane)"
        log.warning(what, package, version)
        return False
    if getattr(sync_send, "__wrapped__", None) is not None:  # patched already (a reloaded module of this one)
        return True

    def guarded_send(self: Any, request: Any) -> Any:
        g = guarding()
        if g is None:
            return sync_send(self, request)
        g._hold_send()
        response = sync_send(self, request)
        g._heard_response(response)
        return response

    async def aguarded_send(self: Any, request: Any) -> Any:
        g = guarding()
        if g is None:
            return await async_send(self, request)
        await g._ahold_send()
        response = await async_send(self, request)
        g._heard_response(response)
        return response

    guarded_send.__wrapped__ = sync_send  # type: ignore[attr-defined]
    aguarded_send.__wrapped__ = async_send  # type: ignore[attr-defined]
    httpx.Client._send_single_request = guarded_send
    httpx.AsyncClient._send_single_request = aguarded_send
    return True


def heard_for(response: Any) -> str | None:
    """The lane a response's 429 already paused (by the guard), or None."""
    return getattr(response, HEARD, None)
