"""Helper threads started from gated threads without ever hanging the starter or losing its timeout.

Prefect raises a sync task's timeout into the task's thread with ``PyThreadState_SetAsyncExc(ident)``, which
sets it on the *first* thread state carrying that ident. A thread being started carries its creator's ident
until its OS thread runs (CPython creates the new thread state in the creator, and new states go first): a
timeout sent in that window is raised in the NEW thread, at its first bytecode, and not in the task's. With
``threading.Thread.start()`` the new thread then dies before it sets its ``_started`` event, and the starter
waits on that event for ever (seen: the wake-up watcher's start hung in a 360-run timeout storm; pinned by
tests/faults/test_spawn.py).

:func:`spawn` starts the thread with ``_thread.start_new_thread`` and a generator stepped in the creator past
its first resume point: the new thread resumes it after a ``yield from`` (a resume that does not check for a
pending exception), inside a ``try``. An exception meant for the creator is caught there and handed back:
the creator, waiting a bounded time on a C lock for the thread to be up, raises it itself, in the call that
started the thread (as if it had landed there). No Python-level lock or event is waited on.
"""

from __future__ import annotations

import _thread
import collections
import logging
import time
from collections.abc import Callable

log = logging.getLogger("lane_plugin.spawn")
UP_SECONDS = 5.0  # the longest a starter waits for its thread to run (a loaded machine takes ms)


class Spawned:
    """A started helper thread: ``began`` once it runs, ``done`` once its target returned (or raised)."""

    __slots__ = ("name", "began", "done", "since", "ident", "stolen", "_end")

    def __init__(self, name: str) -> None:
        self.name = name
        self.began = False
        self.done = False
        self.since = time.monotonic()
        self.ident: int | None = None
        self.stolen: BaseException | None = None  # an exception meant for the starter, caught by this thread
        self._end = _thread.allocate_lock()  # held until the target returned (a C lock: join waits on nothing else)
        self._end.acquire()

    def is_alive(self) -> bool:
        """Running, or being started (for at most :data:`UP_SECONDS`): a thread that died before it ran is not."""
        return not self.done and (self.began or time.monotonic() - self.since < UP_SECONDS)

    def join(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds for the target to return (see :attr:`done`)."""
        if self._end.acquire(True, max(timeout, 0.0)):
            self._end.release()


def _boot(me: Spawned, up, target: Callable[[], None], creator: int):
    try:
        yield from (None,)  # the creator steps to here; the new thread resumes here (no pending-exception check)
        me.ident = _thread.get_ident()
        me.began = True
    except BaseException as exc:  # noqa: BLE001 - raised into the creator's ident before this thread had its own
        if _thread.get_ident() == creator:  # the creator's own, raised while it stepped here (a trace function's):
            raise  # its thread never starts, and the call that started it raises it
        me.stolen = exc
        me.ident = _thread.get_ident()
        me.began = True
    finally:
        up.release()
    try:
        target()
    except BaseException:  # noqa: BLE001 - a helper thread's death is logged, never raised anywhere
        log.exception("lane helper thread %s failed", me.name)
    finally:
        me.done = True
        me._end.release()


def spawn(me: Spawned, target: Callable[[], None]) -> None:
    """Run ``target`` in a new daemon thread recorded in ``me``; returns once it runs (or after :data:`UP_SECONDS`).

    Raises, in the caller, an exception that was raised into the caller's thread while the new thread started (it
    reached the new thread instead: see the module's docstring). ``threading`` knows the thread as a dummy thread
    (if it asks): ``me.name`` is its name for the watchdog's messages."""
    me.since = time.monotonic()
    up = _thread.allocate_lock()
    up.acquire()
    gen = _boot(me, up, target, _thread.get_ident())
    next(gen)  # to the yield: from here on the generator's frame only resumes where it catches everything
    _thread.start_new_thread(collections.deque, (gen, 0))  # (C all the way to the resume: no bytecode before it)
    up.acquire(True, UP_SECONDS)
    stolen, me.stolen = me.stolen, None
    if stolen is not None:
        raise stolen


__all__ = ["UP_SECONDS", "Spawned", "spawn"]
