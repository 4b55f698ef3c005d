"""Preflight checks: is the lane's provider answering before we lease work to it?

A lane's ``preflight`` is an ``http(s)://`` URL that must answer 2xx within the
lane's ``preflight_timeout``, or the **name of a check registered in code**:

* :func:`register_preflight` in the process that ticks (``@register_preflight("openai-up")``), or
* an entry point in the group ``lane_plugin.preflights`` of an installed package
  (``openai-up = "mypkg.checks:openai_up"``), which every process (the ``lane`` CLI too) sees.

A lane row never names code: write access to the ``lane`` table must not become
code execution on every worker. A name nobody registered fails the preflight
with that reason (and ``set_lane`` refuses it). A check runs in a thread with a
deadline: one that takes longer than the timeout fails the preflight (its thread
is left to finish on its own, and is not started again while it hangs); any
exception it raises, ``SystemExit`` and ``KeyboardInterrupt`` included, fails the
preflight with its reason. Checks run outside any database transaction and are
cached for a few seconds per lane, so the many waiters that tick a lane do not
ping the provider on every poll.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar, overload

if TYPE_CHECKING:
    from importlib import metadata
# urllib.request and importlib.metadata are imported where used: every CLI call imports this module
# (lanes validate a preflight spec), and they cost it more than the rest of the ledger's imports together.

from ..errors import InvalidInput
from .spawn import Spawned, spawn

ENTRY_POINT_GROUP = "lane_plugin.preflights"
CACHE_SECONDS = 5.0
_NAME = re.compile(r"^[A-Za-z_][\w.:-]{0,127}$")
_REGISTRY: dict[str, Callable[[], object]] = {}
_LOCK = threading.Lock()
Check = TypeVar("Check", bound=Callable[[], object])
_RUNNING: dict[str, tuple[float, Spawned]] = {}  # checks still in flight past their deadline


@overload
def register_preflight(name: str, fn: Check) -> Check: ...
@overload
def register_preflight(name: str, fn: None = None) -> Callable[[Check], Check]: ...
def register_preflight(name: str, fn: Check | None = None) -> Check | Callable[[Check], Check]:
    """Register ``fn`` (no arguments; truthy = the provider is up) as the preflight check ``name``.

    Use as ``register_preflight("openai-up", fn)`` or as a decorator ``@register_preflight("openai-up")``.
    A lane then names it: ``ledger.set_lane("free", preflight="openai-up")``.

    Example:
        >>> @register_preflight("doc-example-up")
        ... def up():
        ...     return True
        >>> "doc-example-up" in registered()
        True
    """
    if not isinstance(name, str) or not _NAME.match(name) or name.startswith(("http:", "https:")):
        raise InvalidInput("preflight name", name, "expected letters, digits, _ . : - (at most 128), not a URL")

    def add(check: Check) -> Check:
        if not callable(check):
            raise InvalidInput("preflight check", check, "expected a function taking no arguments")
        with _LOCK:
            _REGISTRY[name] = check
        return check

    return add if fn is None else add(fn)


def unregister_preflight(name: str) -> None:
    """Forget a check registered in this process (entry points stay)."""
    with _LOCK:
        _REGISTRY.pop(name, None)


def _entry_points() -> dict[str, metadata.EntryPoint]:
    from importlib import metadata

    try:
        return {ep.name: ep for ep in metadata.entry_points(group=ENTRY_POINT_GROUP)}
    except Exception:  # a broken installed distribution must not stop admission
        return {}


def registered() -> list[str]:
    """Names of every check this process can run: registered in code, or by an entry point."""
    with _LOCK:
        names = set(_REGISTRY)
    return sorted(names | set(_entry_points()))


def _lookup(name: str) -> Callable[[], object] | None:
    with _LOCK:
        fn = _REGISTRY.get(name)
    if fn is not None:
        return fn
    ep = _entry_points().get(name)
    return None if ep is None else ep.load()


def _unknown(name: str) -> str:
    known = registered()
    return (
        f"no preflight check named {name!r} is registered (register_preflight() in code, or an entry point "
        f"in {ENTRY_POINT_GROUP!r}; registered: {', '.join(known) if known else 'none'})"
    )


def validate_spec(spec: str) -> None:
    """An http(s) URL with a host, or the name of a registered check; else :class:`InvalidInput`."""
    if spec.startswith(("http://", "https://")):
        from urllib.parse import urlsplit

        try:
            parts = urlsplit(spec)
            parts.port  # noqa: B018 - raises on a malformed port
        except ValueError as exc:
            raise InvalidInput("preflight", spec, f"malformed URL: {exc}") from None
        if not parts.hostname:
            raise InvalidInput("preflight", spec, "URL has no host")
        return
    if spec not in registered():
        raise InvalidInput(
            "preflight", spec, f"expected an http(s) URL or the name of a registered check; {_unknown(spec)}"
        )


def _http(spec: str, timeout: float) -> tuple[bool, str | None]:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(spec, timeout=timeout) as resp:  # noqa: S310 - operator's URL
            status = resp.status
    except urllib.error.HTTPError as exc:
        return False, f"{spec} answered HTTP {exc.code}"
    if 200 <= status < 300:
        return True, None
    return False, f"{spec} answered HTTP {status}"


def _call(spec: str, timeout: float) -> tuple[bool, str | None]:
    if spec.startswith(("http://", "https://")):
        return _http(spec, timeout)
    fn = _lookup(spec)
    if fn is None:
        return False, _unknown(spec)
    ok = fn()
    return (True, None) if ok else (False, f"preflight {spec!r} returned {ok!r}")


def run(spec: str, timeout: float) -> tuple[bool, str | None]:
    """Run one check with a deadline of ``timeout`` seconds; returns ``(ok, error)`` and never raises."""
    with _LOCK:
        hung = _RUNNING.get(spec)
        if hung is not None and hung[1].is_alive():
            return False, f"preflight {spec!r} still running after {time.monotonic() - hung[0]:.0f} s (hung)"
    box: dict[str, Any] = {}

    def body() -> None:
        try:
            box["result"] = _call(spec, timeout)
        except BaseException as exc:  # noqa: BLE001 - SystemExit, KeyboardInterrupt...: the check failed
            box["result"] = (
                False,
                f"preflight {spec!r} failed: {type(exc).__name__}: {' '.join(str(exc).split())[:300]}",
            )

    started = time.monotonic()
    thread = Spawned(f"lane-preflight {spec[:40]}")
    spawn(thread, body)  # (not threading.Thread.start(): see lane_plugin.ledger.spawn)
    thread.join(timeout)
    if thread.is_alive():
        with _LOCK:
            _RUNNING[spec] = (started, thread)
        return False, f"preflight {spec!r} took longer than its timeout of {timeout:g} s"
    return box.get("result", (False, f"preflight {spec!r} ended without a result"))


class PreflightCache:
    """Per-process cache of recent results, keyed by (lane, spec)."""

    def __init__(self, ttl: float = CACHE_SECONDS):
        self.ttl = ttl
        self._results: dict[tuple[str, str], tuple[float, bool, str | None]] = {}
        self._last: dict[str, tuple[bool, str | None]] = {}

    def check(self, lane: str, spec: str | None, timeout: float) -> tuple[bool, str | None, bool]:
        """Returns ``(ok, error, fresh)``; ``fresh`` is True when the check really ran now."""
        if not spec:
            self._last[lane] = (True, None)
            return True, None, False
        now = time.monotonic()
        hit = self._results.get((lane, spec))
        if hit and now - hit[0] < self.ttl:
            self._last[lane] = (hit[1], hit[2])
            return hit[1], hit[2], False
        ok, err = run(spec, timeout)
        self._results[(lane, spec)] = (now, ok, err)
        self._last[lane] = (ok, err)
        return ok, err, True

    def last(self, lane: str) -> tuple[bool, str | None]:
        """The latest result this process saw for ``lane`` (``(True, None)`` before any)."""
        return self._last.get(lane, (True, None))
