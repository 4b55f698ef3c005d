"""One background thread per process that keeps the running gates' leases alive.

Each held lease is renewed when a third of its lease time has passed, so a
renewal can fail twice before the lease expires. A renewal that finds the lease
gone (reaped, or voided by a newer attempt) marks it ``lost`` and logs loudly;
the gate still settles, and the ledger bills that settlement as late.

Example:
    >>> held = renewer().hold(ledger, lease, logger)              # doctest: +SKIP
    >>> ...                                                       # the body runs
    >>> renewer().release(held)                                   # doctest: +SKIP
"""

from __future__ import annotations

import inspect
import queue
import sys
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from types import FrameType

from ..errors import LeaseLost
from ..ledger.spawn import Spawned, spawn
from ..ledger.wakeups import STALL_SECONDS
from ..ledger.watchdog import stuck
from .shielded_log import shielded

log = shielded("lane_plugin.renewer")  # its calls hold a Prefect timeout off: see shielded_log
MIN_INTERVAL = 0.05
_SUSPENDABLE = inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR | inspect.CO_ITERABLE_COROUTINE


@dataclass(eq=False)
class Held:
    """A lease being kept alive; ``lost`` turns True if a renewal found it gone.

    ``owner``: the gate holding it (weakly): its lease is renewed only while the gate's ``_held`` is this
    handle and its thread lives. A gate whose thread an exception interrupted between :meth:`Renewer.hold`
    and keeping the handle, or whose thread is gone, is a holder that is gone: its lease is left to expire
    (and be reaped), never renewed for ever.
    """

    ledger: object
    lease: object
    logger: object
    interval: float
    renew_at: float
    lost: bool = False
    lease_until: float = field(default=0.0)
    owner: Callable[[], object] | None = None
    thread: threading.Thread | None = None
    frame: FrameType | None = None  # the plain (not generator, not coroutine) frame running the gated block

    def holder_gone(self) -> bool:
        if self.thread is not None and not self.thread.is_alive():
            return True
        if self.owner is not None:
            gate = self.owner()
            if gate is None or getattr(gate, "_held", None) is not self:
                return True
        if self.frame is not None and self.thread is not None and self.thread.ident is not None:
            # an exception raised into the thread as __exit__ began (before its first line) skips the settlement:
            # the block's frame has then left the thread's stack, and nobody will ever release this lease
            f = sys._current_frames().get(self.thread.ident)
            while f is not None and f is not self.frame:
                f = f.f_back
            return f is None
        return False


class Renewer:
    """Renews every held lease from one daemon thread (started on first use).

    Nothing a gated thread does here holds a lock an exception raised into it (Prefect's timeout, at any
    bytecode) could leave held: ``_held`` is changed by single set operations, the thread is woken through a
    :class:`queue.SimpleQueue`, and it is started without a lock (the one named in ``_thread`` runs).
    The watchdog: :meth:`hold` fails with :class:`~lane_plugin.errors.WatchdogTimeout` (logged once at
    ERROR, naming the thread) when the renewer has not cycled for
    :data:`~lane_plugin.ledger.wakeups.STALL_SECONDS`.
    """

    def __init__(self):
        self._held: set[Held] = set()
        self._nudge: queue.SimpleQueue[None] = queue.SimpleQueue()
        self._thread: Spawned | None = None
        self.beat = time.monotonic()  # the thread's last cycle (the watchdog's liveness proof)
        self._lease_seconds: dict[tuple[int, str], tuple[float, float]] = {}
        self._wake_at = 0.0  # when the thread wakes next (monotonic)

    def _interval(self, ledger, lane: str) -> float:
        key, now = (id(ledger), lane), time.monotonic()
        cached = self._lease_seconds.get(key)
        if cached is None or now - cached[1] > 30.0:
            cached = (float(ledger.lane(lane).lease_seconds), now)
            self._lease_seconds[key] = cached
        return max(MIN_INTERVAL, cached[0] / 3.0)

    def hold(self, ledger, lease, logger=None, owner: object | None = None, frame: FrameType | None = None) -> Held:
        """Start keeping ``lease`` alive; returns the handle to :meth:`release`.

        ``owner``: the gate that keeps the handle as its ``_held`` (renewed only while it does); ``frame``: the
        frame running its block (renewed only while it is on its thread's stack; not a generator's or a
        coroutine's, which leave the stack between steps).
        """
        interval = self._interval(ledger, lease.lane)
        if frame is not None and frame.f_code.co_flags & _SUSPENDABLE:
            frame = None
        held = Held(
            ledger,
            lease,
            logger or log,
            interval,
            time.monotonic() + interval,
            lease_until=lease.lease_until,
            owner=weakref.ref(owner) if owner is not None else None,
            thread=threading.current_thread(),
            frame=frame,
        )
        thread = self._thread
        if thread is not None and thread.is_alive() and time.monotonic() - self.beat > STALL_SECONDS + 10.0:
            raise stuck("the lease renewer", thread.name, since=self.beat)  # its cycle waits 5 s at most
        self._held.add(held)  # before a start: the new thread's first look sees it
        if thread is None or not thread.is_alive():
            self._start()
        elif held.renew_at < self._wake_at or not self._wake_at:
            self._nudge.put(None)  # due before the thread next wakes (short leases only), or it is between waits
        return held

    def _start(self) -> None:
        # No lock (see the class): the thread named in _thread runs; another started at the same time exits. Not
        # threading.Thread.start(): a timeout sent to this thread meanwhile made its wait endless (ledger.spawn).
        me = Spawned("lane-lease-renewer")
        self._thread = me
        spawn(me, lambda: self._run(me))

    def release(self, held: Held) -> None:
        """Stop renewing (the body finished); idempotent."""
        self._held.discard(held)

    def _run(self, me: Spawned) -> None:
        while self._thread is me:
            self.beat = now = time.monotonic()
            held = list(self._held)  # one C call: gated threads add and discard meanwhile
            due = [h for h in held if h.renew_at <= now]
            if not due:
                nxt = min((h.renew_at for h in held), default=now + 5.0)
                self._wake_at = now + max(0.01, min(nxt - now, 5.0))
                try:
                    self._nudge.get(timeout=self._wake_at - now)
                except queue.Empty:
                    pass
                self._wake_at = 0.0
                continue
            for h in due:
                if h.holder_gone():  # its gate was interrupted before it kept the handle, or its thread ended
                    self._held.discard(h)
                    continue
                self._renew(h)

    def _renew(self, held: Held) -> None:
        lease = held.lease
        try:
            held.lease_until = held.ledger.renew(lease.job_id, lease.token)
            held.renew_at = time.monotonic() + held.interval
        except LeaseLost as exc:
            if held not in self._held or held.holder_gone():
                self._held.discard(held)
                return  # the body finished and settled meanwhile: not a loss
            self._held.discard(held)
            held.lost = True
            held.logger.error(
                "LEASE LOST: job %s (stage %r, lane %r, estimate %d, attempt %d) no longer holds its lease: %s. "
                "The body keeps running and its tokens will still be billed (late), but the lane may have "
                "admitted other work into its room.",
                lease.job_id,
                lease.stage,
                lease.lane,
                lease.est,
                lease.attempt,
                exc,
            )
        except Exception as exc:  # the database is briefly unavailable: try again soon
            held.renew_at = time.monotonic() + max(MIN_INTERVAL, held.interval / 4)
            held.logger.warning("lease renewal of job %s failed (%s); retrying", lease.job_id, exc)


_renewer = Renewer()


def renewer() -> Renewer:
    """The process's renewer."""
    return _renewer


__all__ = ["Held", "Renewer", "renewer"]
