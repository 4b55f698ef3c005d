"""PostgreSQL's connection pool: a :class:`queue.SimpleQueue` of slots (``LANE_PG_POOL``, default :data:`PG_POOL`),
safe against exceptions raised asynchronously into the threads that use it (Prefect's timeouts)."""

from __future__ import annotations

import os
import queue
import weakref

PG_POOL = 8  # PostgreSQL connections per ledger per process, shared by its threads, unless LANE_PG_POOL says


def idle(conn) -> bool:
    """A connection fit to go back to the pool: open, not broken, no transaction left open."""
    from psycopg.pq import TransactionStatus

    return (
        conn is not None
        and not conn.closed
        and not conn.broken
        and conn.info.transaction_status == TransactionStatus.IDLE
    )


class Slot:
    """One of the :data:`PG_POOL` places of a process's PostgreSQL pool: an open connection or None.

    The pool is a :class:`queue.SimpleQueue` of slots: taking and giving back are single C calls, with no
    Python-level lock that an exception raised asynchronously into a thread (Prefect's timeout) could leave
    held. A slot dropped while out of the pool (such an exception landed between taking it and keeping it, or
    in the frame that held it) is not lost: when it is collected its connection is closed and a fresh slot
    takes its place, so the pool never shrinks and no connection outlives its slot.
    """

    __slots__ = ("conn", "_pool", "_pid")

    def __init__(self, pool: queue.SimpleQueue):
        self.conn = None
        self._pool = weakref.ref(pool)
        self._pid = os.getpid()

    def __del__(self, _getpid=os.getpid) -> None:  # (bound early: module globals may be gone at exit)
        pool, conn = self._pool(), self.conn
        if self._pid != _getpid():  # a parent's, copied by fork: psycopg leaves its session alone
            return
        try:
            if conn is not None:
                conn.close()
            if pool is not None:  # the pool is alive: the slot was lost on its way, not dropped with the pool
                pool.put(type(self)(pool))
        except Exception:  # interpreter shutdown: nothing left to give back to
            pass


def new_pool(size: int = PG_POOL) -> queue.SimpleQueue:
    pool: queue.SimpleQueue = queue.SimpleQueue()
    for _ in range(size):
        pool.put(Slot(pool))
    return pool


def discard_slot(pool: queue.SimpleQueue, held: list) -> None:
    """Close the connection of the slot in ``held`` (the server rolls back what its session left open) and give the
    slot back empty: the transaction failed or was interrupted, its connection is never reused."""
    empty(held[0])
    pool.put(held.pop())


def empty(slot: Slot) -> None:
    """Close the slot's connection, if it has one; the slot stays, to connect again when next taken."""
    conn, slot.conn = slot.conn, None
    if conn is not None:
        try:
            conn.close()
        except Exception:
            pass
