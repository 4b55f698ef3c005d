"""Preflight checks: is the lane's provider answering before we lease work to it?

A spec is an ``http(s)://`` URL that must answer 2xx within the lane's
timeout, or ``module:function`` returning a truthy value. Checks run outside
any database transaction and are cached for a few seconds per lane, so the
many waiters that tick a lane do not ping the provider on every poll.
"""

from __future__ import annotations

import importlib
import re
import time
import urllib.error
import urllib.request

from ..errors import InvalidInput

_CALLABLE = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
CACHE_SECONDS = 5.0


def validate_spec(spec: str) -> None:
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
    if not _CALLABLE.match(spec):
        raise InvalidInput("preflight", spec, "expected an http(s) URL or module:function")


def run(spec: str, timeout: float) -> tuple[bool, str | None]:
    """Run one check; returns ``(ok, error)`` and never raises."""
    try:
        if spec.startswith(("http://", "https://")):
            with urllib.request.urlopen(spec, timeout=timeout) as resp:  # noqa: S310 - operator's URL
                status = resp.status
            if 200 <= status < 300:
                return True, None
            return False, f"{spec} answered HTTP {status}"
        module, _, name = spec.partition(":")
        ok = getattr(importlib.import_module(module), name)()
        return (True, None) if ok else (False, f"{spec} returned {ok!r}")
    except urllib.error.HTTPError as exc:
        return False, f"{spec} answered HTTP {exc.code}"
    except Exception as exc:  # the check's own failure is the finding
        return False, f"{spec} failed: {type(exc).__name__}: {exc}"


class PreflightCache:
    """Per-process cache of recent results, keyed by (lane, spec)."""

    def __init__(self, ttl: float = CACHE_SECONDS):
        self.ttl = ttl
        self._results: dict[tuple[str, str], tuple[float, bool, str | None]] = {}

    def check(self, lane: str, spec: str | None, timeout: float) -> tuple[bool, str | None, bool]:
        """Returns ``(ok, error, fresh)``; ``fresh`` is True when the check really ran now."""
        if not spec:
            return True, None, False
        now = time.monotonic()
        hit = self._results.get((lane, spec))
        if hit and now - hit[0] < self.ttl:
            return hit[1], hit[2], False
        ok, err = run(spec, timeout)
        self._results[(lane, spec)] = (now, ok, err)
        return ok, err, True
