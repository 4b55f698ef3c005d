"""The watchdog: a wake-up or renewal lock not taken (or a watcher not cycling) within a few seconds is an
error the task sees, never a wait for ever.

A lock left held by a thread that an exception interrupted (Prefect's timeout is raised into a worker thread
at any bytecode) would stop every gated thread of the process. The gate's own locks are built so that this
cannot happen (:mod:`lane_plugin.ledger.wakeups`, :mod:`lane_plugin.gating.renewal`); the watchdog proves it
at run time: it names the holder once at ERROR and fails the affected task with
:class:`~lane_plugin.errors.WatchdogTimeout`.
"""

from __future__ import annotations

import logging
import time

from ..errors import WatchdogTimeout

log = logging.getLogger("lane_plugin.watchdog")
_said: set[tuple[str, str]] = set()


def stuck(what: str, holder: str, since: float | None = None) -> WatchdogTimeout:
    """The error to raise for ``what`` held (or stalled) by the thread named ``holder``; logged once at ERROR."""
    ago = f" for {time.monotonic() - since:.1f}s" if since is not None else ""
    msg = (
        f"{what} was not available{ago} (held by thread {holder or 'unknown'!r}); failing this task rather "
        "than waiting for ever"
    )
    if (what, holder) not in _said:
        _said.add((what, holder))
        log.error("lane watchdog: %s", msg)
    return WatchdogTimeout(msg, what=what, holder=holder)


__all__ = ["stuck"]
