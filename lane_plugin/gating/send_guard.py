"""The send guard: inside a gated body, a provider's 429 closes the lane the moment httpx has it, and a request
about to leave while the lane is closed waits for the reopen instead of being sent.

The gate's own check runs before the body (:meth:`ProviderPause._paused_for`), and a 429 reaches the gate
only when the SDK raises it, 1-8 ms after its answer arrived (longer on a loaded machine, and never while the
SDK retries on its own). A request another worker of the process begins in that gap goes out into the window
the 429 closed. The guard closes the gap where every request of the openai and anthropic SDKs passes: httpx's
``Client._send_single_request`` / ``AsyncClient._send_single_request`` (after the client's request hooks,
before its response hooks), in ``httpx`` and in its fork ``httpx2`` (which openai 3.x and anthropic 2.x send
through), patched by the first gate to reach its body (and again by a later gate if another library put the
original back). ``@lane_task`` imports both packages (those installed) when it decorates a function, at import
and outside any lease (:func:`preload`); the guard itself never imports one (see :data:`_modules`). It acts only in a gated body (:func:`lane_plugin.current_gate`; a thread the body starts
carries no gate unless it runs in a copy of the body's context), and there only on the provider's requests
(:mod:`lane_plugin.gating.provider_requests`: an LLM SDK's, one to a host in ``LANE_PROVIDER_HOSTS``, or to
one that answered with a provider's rate-limit headers; never Prefect's own API); every other request passes
untouched. For each request of a gated body to the provider:

1. before it is sent: while the gate's lane is paused (this process's memory of the pause first, then the
   ledger's row: another process's 429) or another gate's probe is out after a pause, it waits (the lease
   renewed meanwhile), then goes; its charges count from then. A request the SDK retries on its own after a
   429 waits the same way, so the SDK's retries keep working: a held send waits, it never fails.
2. once its answer is in: a 429 pauses the lane for as long as its headers say (:func:`wait_from_headers`),
   in this process's memory at once and then in the ledger for every process, before the SDK sees the
   response; any other answer to the probe after a pause reopens the lane. An async client's ledger reads
   and writes run in a thread (:func:`asyncio.to_thread`), not on the event loop.

Reading ``x-ratelimit-remaining-*`` on every response to see spend outside the lane stays
:func:`lane_plugin.track_limits`' (opt-in). ``LANE_SEND_GUARD=false`` turns the guard off: nothing is patched
while it is false, and a guard installed before lets every request pass (the check before the body and the
pause on the SDK's error remain).
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

from ..errors import InvalidInput
from ..settings import lane_settings
from . import provider_requests
from .current import current_gate
from .shielded_log import shielded

log = shielded("lane_plugin.send_guard")  # its calls hold a Prefect timeout off: see shielded_log
_installed = False
# The attribute set on an httpx response whose 429 the guard has written as the lane's pause: the gate's own
# handling of the SDK's error, and track_limits' response hook, do not pause the lane (and count the job's
# 429) a second time.
HEARD = "_lane_plugin_paused"


def guarding(request: Any = None, client: Any = None) -> Any:
    """The gate whose sends the guard watches here: the running gate, admitted, with the guard on; else None.
    Given a request (and the httpx client sending it), None too unless it is the provider's
    (:func:`~lane_plugin.gating.provider_requests.is_providers`)."""
    g = current_gate()
    if not _installed or g is None or getattr(g, "lease", None) is None or not hasattr(g, "_hold_send"):
        return None
    try:
        on = lane_settings().send_guard
    except InvalidInput as exc:  # a LANE_* variable made bad since the gate began: the next gate refuses it
        log.warning("lane send guard: a request passes unguarded: %s", exc)
        return None
    if not on:
        return None
    if request is not None and not provider_requests.is_providers(g.lease.lane, request, client):
        return None
    return g


# The httpx packages the SDKs send through: httpx, and its fork httpx2 (anthropic 2.x and openai 3.x use it).
PACKAGES = ("httpx", "httpx2")
# On each of the guard's own wrappers: (the wrapper itself, the send it wraps). A wrapper another library puts
# around the guard's with functools.wraps copies the attribute, so it is the guard's only where it names itself.
MARK = "_lane_send_guard"
# package -> its module, or None: without the send to patch (said once). A package is taken from sys.modules,
# never imported here: install() runs in a gated thread, under its lease, where an import costs the lease's time
# and a timeout raised into it could leave the package's import lock held for every later importer. An SDK
# imports the package it sends through before it has a client to send with; one imported later (inside a
# body) is patched by the next gate's install().
_modules: dict[str, Any] = {}


_preloaded = False


def preload() -> None:
    """Import the httpx packages there are (:data:`PACKAGES`), once per process, so the first gate finds them to
    patch even when the SDK is imported only inside a task's body. Called where ``@lane_task`` decorates a
    function: at import, in the main thread, outside any lease."""
    global _preloaded
    if _preloaded:
        return
    _preloaded = True
    import importlib

    for name in PACKAGES:
        try:
            importlib.import_module(name)
        except ImportError:  # not installed: nothing of it to guard
            continue


def install() -> bool:
    """Patch each httpx package there is (cheap when patched already: every gate's check calls it); False if
    none is. ``LANE_SEND_GUARD=false`` patches nothing (a guard installed before stays, idle while it is false).

    Each send is wrapped unless a guard's wrapper is on it already (marked :data:`MARK`, not told by
    ``__wrapped__``): a send another library wrapped before the first gate (a recorder such as vcrpy's stub, an
    instrumentation) is wrapped all the same, and one it wrapped after the guard keeps the guard inside. A send
    put back without the guard (a recorder's exit) is wrapped again at the next gate."""
    global _installed
    if not lane_settings().send_guard:
        return _installed
    # No lock: the first gate to reach its body installs it, in a thread a Prefect timeout may interrupt at any
    # bytecode (a `with lock:` can be left held at its exit line). Two threads patching at once each wrap what
    # is under any guard's wrapper, so the last write leaves one layer.
    patched = False
    for name in PACKAGES:
        module = sys.modules.get(name)
        if (
            name not in _modules
            and module is not None
            and not getattr(getattr(module, "__spec__", None), "_initializing", False)
        ):
            _modules[name] = _patchable(module, name)  # (one being imported by another thread: the next install)
        httpx = _modules.get(name)
        if httpx is not None:
            _wrap(httpx.Client, _guarded_send)
            _wrap(httpx.AsyncClient, _aguarded_send)
            patched = True
    _installed = _installed or patched
    return patched


def _patchable(httpx: Any, package: str) -> Any:
    classes = (getattr(httpx, "Client", None), getattr(httpx, "AsyncClient", None))
    if not all(callable(getattr(cls, "_send_single_request", None)) for cls in classes):
        version = getattr(httpx, "__version__", "?")
        what = "lane send guard: %s %s has no _send_single_request: not installed (the SDK's error pauses the lane)"
        log.warning(what, package, version)
        return None
    return httpx


def _ours(send: Any) -> Any:
    """The send under ``send`` when it is a guard's wrapper, else None."""
    mark = getattr(send, MARK, None)
    return mark[1] if isinstance(mark, tuple) and len(mark) == 2 and mark[0] is send else None


def _wrap(cls: Any, make: Any) -> None:
    send = cls._send_single_request
    inner = send
    for _ in range(16):  # a guard's wrapper under another library's (that library wrapped after the guard)
        if _ours(inner) is not None:
            return
        inner = getattr(inner, "__wrapped__", None)
        if inner is None:
            break
    cls._send_single_request = make(send)


def _guarded_send(send: Any) -> Any:
    def guarded_send(self: Any, request: Any) -> Any:
        g = guarding()
        if g is None:
            return send(self, request)
        lane = g.lease.lane
        if not provider_requests.is_providers(lane, request, self):
            response = send(self, request)
            if provider_requests.hear(lane, request, response):  # the provider's after all: its 429 counts
                g._heard_response(response)
            return response
        g._hold_send()
        response = send(self, request)
        provider_requests.hear(lane, request, response)
        g._heard_response(response)
        return response

    setattr(guarded_send, MARK, (guarded_send, send))
    guarded_send.__wrapped__ = send  # type: ignore[attr-defined]
    return guarded_send


def _aguarded_send(send: Any) -> Any:
    async def aguarded_send(self: Any, request: Any) -> Any:
        g = guarding()
        if g is None:
            return await send(self, request)
        lane = g.lease.lane
        if not provider_requests.is_providers(lane, request, self):
            response = await send(self, request)
            if provider_requests.hear(lane, request, response):
                await asyncio.to_thread(g._heard_response, response)
            return response
        await g._ahold_send()
        response = await send(self, request)
        provider_requests.hear(lane, request, response)
        await asyncio.to_thread(g._heard_response, response)  # ledger writes on a 429: not on the event loop
        return response

    setattr(aguarded_send, MARK, (aguarded_send, send))
    aguarded_send.__wrapped__ = send  # type: ignore[attr-defined]
    return aguarded_send


def heard_for(response: Any) -> str | None:
    """The lane a response's 429 already paused (by the guard), or None."""
    return getattr(response, HEARD, None)
