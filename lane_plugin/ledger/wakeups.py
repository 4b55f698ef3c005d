"""Wake-ups instead of polls: how a waiting gate learns that its job was leased.

Each waiting job has a :class:`Waiting` (a ``threading.Event``). Any thread of this process whose
commit leases jobs (a tick, a settlement handing its room on, a reap) sets their events at once. One
watcher thread per ledger per process covers what other processes do:

- on PostgreSQL it ``LISTEN``s on the lane channel (a ``NOTIFY`` is sent when jobs are leased or
  room frees; notifications from this process's own connections are ignored, its waiters were woken
  already). A ``leased`` payload names the jobs leased (:func:`lane_plugin.ledger.waiters.leased_what`):
  the watcher reads the rows of those it waits for, by primary key, and no row at all when it waits
  for none of them; a payload that names none (an older version's, or a list past PostgreSQL's
  payload limit) makes it read all its waiting jobs' rows. The read is one statement on the listening
  connection, which also stamps the rate charges of those it finds leased (their requests go out
  now: :func:`lane_plugin.ledger.waiters.rows_sent`), so a woken waiter starts its body without a
  write transaction of its own;
- on SQLite it reads its waiting jobs' own rows every :data:`POLL_SQLITE` seconds (primary-key
  lookups in one read transaction: no lock, no tick);
- on both, a timed tick: room that frees by the burst window sliding has no event (nobody settles),
  so a tick that leaves a job blocked by the window says when the window will have room for it
  (:func:`lane_plugin.ledger.rates.free_at`) and the watcher ticks that lane at that moment
  (:meth:`Wakeups.tick_at`);
- on both, a slow safety poll every :data:`SAFETY_SECONDS`: it reads all its waiting jobs' rows (a
  lost ``NOTIFY``, a job parked by another process, are caught here), reaps expired leases if there are any
  (one index read; the reap hands the room on), ticks the lanes its jobs still wait in (a try-lock:
  returns at once if another tick runs; room can free with no event, e.g. a run's reserve lapsing),
  and beats the process's waiter heartbeat (:mod:`lane_plugin.ledger.waiters`).

The watcher exits when nothing waits and is started again by the next waiter; it is a daemon
thread and holds one extra connection on PostgreSQL (closed when it exits): nothing outlives the
process.
"""

from __future__ import annotations

import logging
import queue
import time
from dataclasses import dataclass, field

from . import queries, waiters
from .spawn import Spawned, spawn
from .watchdog import stuck as watchdog_timeout

log = logging.getLogger("lane_plugin.wakeups")
POLL_SQLITE = 0.1  # SQLite: how often the watcher reads its waiting jobs' rows
SAFETY_SECONDS = 1.0  # the slow safety poll: reap check, tick, heartbeat
RETICK_SECONDS = 0.02  # a tick that found another running is tried again this soon
TIMER_SLICE = 0.02  # PostgreSQL: the longest a timed tick set by another thread waits behind a LISTEN wait
_IDLE_EXIT = 5.0  # the watcher exits after this long with nothing waiting
# The database away: the watcher tries again after 0.2 s, doubling up to this (a restart is waited out
# without a warning five times a second), and warns once per distinct error until it is back.
RETRY_MAX_SECONDS = 2.0
STALL_SECONDS = 150.0  # a watcher not cycling this long (past a locked database's 30 s busy wait and 60 s retry)
# A waiter woken this long ago and still registered was interrupted before it unregistered (an exception raised
# into its thread at any bytecode): the watcher lets it go, so it neither idles for ever nor heart-beats for it.
STALE_WOKEN_SECONDS = 60.0


class Latch:
    """A ``threading.Event`` for one waiter whose ``set`` and ``wait`` are single C calls.

    ``threading.Event`` takes a Python-level ``Condition`` in both: an exception raised asynchronously into
    the waiting thread (Prefect's timeout, injected at the next bytecode) can land right after its lock
    was won, leaving it held; the watcher's ``set`` then blocks for ever, and with it every waiter of the
    process. A :class:`queue.SimpleQueue` hands the wake-up over with no lock a Python frame holds.
    """

    __slots__ = ("_flag", "_q")

    def __init__(self) -> None:
        self._flag = False
        self._q: queue.SimpleQueue[None] = queue.SimpleQueue()

    def set(self) -> None:
        self._flag = True
        self._q.put(None)

    def is_set(self) -> bool:
        return self._flag

    def clear(self) -> None:
        self._flag = False
        while True:  # a set() after the flag went down stays set: its flag is up again
            try:
                self._q.get_nowait()
            except queue.Empty:
                return

    def wait(self, timeout: float | None = None) -> bool:
        if self._flag:
            return True
        try:
            self._q.get(timeout=timeout)
        except queue.Empty:
            pass
        return self._flag


@dataclass(eq=False)
class Waiting:
    """One waiting job: ``event`` is set when its row is no longer ``new`` (``row`` then holds it).

    ``sent``: the read that found ``row`` leased also stamped its rate charge (PostgreSQL's watcher).
    """

    job_id: str
    lane: str
    event: Latch = field(default_factory=Latch)
    row: tuple | None = None
    sent: bool = False


class Wakeups:
    """This process's waiting jobs on one ledger, and the watcher thread that wakes them.

    No lock is shared with the gated threads (an exception raised asynchronously can stop any of them at
    any bytecode, even between a ``with`` block's last line and the lock's release): ``_jobs`` is changed
    by single dict operations, reticks and timed ticks reach the watcher through a
    :class:`queue.SimpleQueue` it alone reads, and the watcher is started without a lock (the one named in
    ``_thread`` runs) and without ``threading.Thread.start()``, whose wait a timeout sent to the starter at that
    moment makes endless (:mod:`lane_plugin.ledger.spawn`). The watchdog (:meth:`check_alive`) proves liveness: a watcher that has not cycled
    for :data:`STALL_SECONDS` fails its waiters with :class:`~lane_plugin.errors.WatchdogTimeout`, logged
    once at ERROR naming it.
    """

    def __init__(self, ledger):
        self.ledger = ledger
        self._jobs: dict[str, Waiting] = {}
        self._thread: Spawned | None = None
        self._inbox: queue.SimpleQueue[tuple[str, str, float]] = queue.SimpleQueue()  # (kind, lane, when)
        self._retick: set[str] = set()  # the watcher's own (filled from _inbox)
        # lane -> when (monotonic) to tick it: its burst window has room again, or its tick found another running
        # (the watcher's own)
        self._timers: dict[str, float] = {}
        self._next_read = 0.0  # SQLite: when the poll reads the waiting rows next (a retick or timer does not)
        self._woken: dict[str, tuple[Waiting, float]] = {}  # job id -> its waiter, first seen woken (the watcher's own)
        self.beat = time.monotonic()  # the watcher's last cycle (the watchdog's liveness proof)

    def register(self, job_id: str, lane: str) -> Waiting:
        """Wait for ``job_id``: the returned :class:`Waiting`'s event is set when it is leased (or parked)."""
        w = Waiting(job_id, lane)
        self._jobs[job_id] = w  # first: a watcher deciding to exit now sees it (under _start_lock)
        self._inbox.put(("job", lane, 0.0))  # an idle watcher waits on its inbox: it looks at the new job at once
        thread = self._thread
        if thread is None or not thread.is_alive():
            self._start_watcher()
        return w

    def _start_watcher(self) -> None:
        # No lock: the watcher named in _thread is the one that runs; one that finds another named exits. Two
        # registers starting one each at once leave one running; a start interrupted before the thread ran leaves
        # a record that is not alive after spawn.UP_SECONDS, and the next waiter (or the watchdog) starts another.
        me = Spawned("lane-wakeups")
        self.beat = time.monotonic()
        self._thread = me
        spawn(me, lambda: self._run(me))

    def resume(self, w: Waiting) -> None:
        """``w`` was woken and waits on (its job went back to the queue): watched again, even if the watcher let it
        go as stale meanwhile."""
        self._jobs[w.job_id] = w
        self._inbox.put(("job", w.lane, 0.0))

    def keep(self, w: Waiting) -> None:
        """A waiter still waiting, at each turn of its wait: watched again if its entry is gone (let go as stale
        in a race with :meth:`resume`)."""
        if self._jobs.get(w.job_id) is not w:
            self.resume(w)

    def unregister(self, job_id: str | None) -> None:  # None: the intake wrote no job (nothing registered)
        self._jobs.pop(job_id, None)  # type: ignore[arg-type]

    def wake(self, leases: list) -> None:
        """These leases were granted by a commit in this process: their waiters go on at once, each
        with its job's row as that commit left it (no read of its own row; ``admitted_at`` not given)."""
        for lease in leases:
            w = self._jobs.get(lease.job_id)
            if w is not None:
                w.sent = False
                w.row = (
                    lease.job_id,
                    lease.lane,
                    lease.stage,
                    lease.est,
                    lease.attempt,
                    lease.token,
                    lease.lease_until,
                    lease.run_key,
                    lease.rate_cost,
                    "leased",
                    None,
                    None,
                )
                w.event.set()

    def retick(self, lane: str) -> None:
        """A tick found another running: the watcher tries again shortly (nothing is lost meanwhile)."""
        self._inbox.put(("retick", lane, 0.0))

    def tick_at(self, lane: str, delay: float) -> None:
        """Tick ``lane`` ``delay`` seconds from now, when its burst window has room for a job that waits
        on it (the earliest such time wins; a tick that finds nothing more to lease costs one transaction)."""
        self._inbox.put(("timer", lane, time.monotonic() + delay))

    @property
    def waiting(self) -> int:
        return len(self._jobs)

    def check_alive(self) -> None:
        """The watchdog, asked by a waiter: raise :class:`~lane_plugin.errors.WatchdogTimeout` (logged once at
        ERROR) if the watcher has jobs to watch but has not cycled for :data:`STALL_SECONDS`."""
        thread = self._thread
        if thread is None or not thread.is_alive():
            if self._jobs:
                self._start_watcher()
            return
        if time.monotonic() - self.beat > STALL_SECONDS:
            raise watchdog_timeout("the wake-up watcher", thread.name, since=self.beat)

    # -- the watcher thread ----------------------------------------------------------------------------
    def _drain(self, wait: float = 0.0) -> None:
        """Take what other threads asked for (reticks, timed ticks), waiting up to ``wait`` for the first."""
        try:
            msg = self._inbox.get(timeout=wait) if wait > 0 else self._inbox.get_nowait()
        except queue.Empty:
            return
        while True:
            kind, lane, when = msg
            if kind == "retick":
                self._retick.add(lane)
            elif kind == "timer":
                self._set_timer(lane, when)
            try:
                msg = self._inbox.get_nowait()
            except queue.Empty:
                return

    def _exit_idle(self, me: Spawned) -> bool:
        if self._thread is me:
            self._thread = None
        if not self._jobs:  # a register from here on finds no watcher and starts one
            return True
        if self._thread is None:  # registered meanwhile, and no other watcher started: stay
            self._thread = me
        return self._thread is not me

    def _run(self, me: Spawned) -> None:
        pg = self.ledger.db.dialect == "postgresql"
        listener = None
        next_safety = next_beat = time.monotonic()
        idle_since = None
        failures, said = 0, None
        try:
            while True:
                now = self.beat = time.monotonic()
                if self._thread is not me:  # another watcher was started meanwhile: it carries on
                    return
                self._drain()
                if not self._jobs:
                    idle_since = idle_since or now
                    if now - idle_since > _IDLE_EXIT and self._exit_idle(me):
                        return
                else:
                    idle_since = None
                retick, self._retick = self._retick, set()  # asked for by another thread, or timed: tick now
                retick |= self._due(now)
                wake = min(next_safety, next_beat, *self._timers.values())
                timeout = max(0.0, wake - now)
                if idle_since is not None:  # nothing to watch: wait for a register's message (it was a busy loop)
                    timeout = max(timeout, min(POLL_SQLITE, _IDLE_EXIT - (now - idle_since)), 0.0)
                notified: set[tuple] = set()
                try:
                    if pg and listener is None:
                        listener = _Listener(self.ledger)
                        next_safety = now  # (re)connected: look at once, a NOTIFY may have been missed
                    if not retick:
                        if listener is not None:  # in slices: another thread may set an earlier timed tick
                            notified = listener.wait(min(timeout, TIMER_SLICE))
                            self._drain()
                        else:
                            poll = max(RETICK_SECONDS, self._next_read - now) if self._jobs else POLL_SQLITE
                            self._drain(min(timeout, poll))
                        retick |= self._retick | self._due(time.monotonic())
                        self._retick = set()
                    next_safety, next_beat = self._cycle(listener, notified, retick, next_safety, next_beat)
                    if failures:
                        log.info("lane wake-up watcher: the database answers again after %d failed tries", failures)
                        failures, said = 0, None
                except Exception as exc:  # the database is briefly away (a restart): reconnect, try again
                    failures += 1
                    (log.warning if str(exc) != said else log.debug)("lane wake-up watcher: %s", exc)
                    said = str(exc)
                    if listener is not None:
                        listener.close()
                        listener = None
                    time.sleep(min(0.2 * 2 ** min(failures - 1, 10), RETRY_MAX_SECONDS))
        finally:
            if listener is not None:
                listener.close()

    def _set_timer(self, lane: str, when: float) -> None:
        """Tick ``lane`` at ``when`` (monotonic) unless an earlier tick of it is set (the watcher's own)."""
        if when < self._timers.get(lane, float("inf")):
            self._timers[lane] = when

    def _due(self, now: float) -> set[str]:
        """The lanes whose timed tick is due (taken off the timers; the watcher's own)."""
        due = {lane for lane, when in self._timers.items() if when <= now}
        for lane in due:
            del self._timers[lane]
        return due

    def _drop_stale(self, jobs: list[Waiting], now: float) -> list[Waiting]:
        """``jobs`` less those woken :data:`STALE_WOKEN_SECONDS` ago and never unregistered, which leave ``_jobs``."""
        seen, self._woken = self._woken, {}
        kept = []
        for w in jobs:
            if w.event.is_set():
                was = seen.get(w.job_id)
                first = was[1] if was is not None and was[0] is w else now  # a retry's new Waiting starts anew
                self._woken[w.job_id] = (w, first)
                if now - first > STALE_WOKEN_SECONDS:
                    del self._woken[w.job_id]
                    gone = self._jobs.pop(w.job_id, None)
                    # registered again meanwhile, or put back to wait (waiting.take clears, then resumes): it stays
                    if gone is not None and (gone is not w or not w.event.is_set()):
                        self._jobs.setdefault(w.job_id, gone)
                    else:
                        log.debug(
                            "lane wake-up watcher: job %s woken %.0f s ago, never unregistered", w.job_id, now - first
                        )
                    continue
            kept.append(w)
        return kept

    def _cycle(self, listener, notified: set[tuple], retick: set[str], next_safety: float, next_beat: float):
        now = time.monotonic()
        jobs = self._drop_stale(list(self._jobs.values()), now)  # one C call: other threads add and remove meanwhile
        safety = now >= next_safety
        # SQLite reads on its poll's schedule only: a cycle woken early (a retick while two processes' ticks
        # meet, a timed tick) reading too would multiply the reads by the contention
        polled = listener is None and now >= self._next_read
        if jobs and (polled or safety or any(k != "room" and ids is None for _, k, ids in notified)):
            self._read(jobs, listener)  # all of them: SQLite's poll, the safety poll, a payload naming no jobs
            if listener is None:
                self._next_read = now + POLL_SQLITE
        elif jobs and notified:  # only the jobs named that this process waits for; no read if none
            named = set().union(*(ids for _, _, ids in notified if ids))
            mine = [w for j in named if (w := self._jobs.get(j)) is not None]
            if mine:
                self._read(mine, listener)
        if jobs and now >= next_beat:  # (a stale woken entry is no longer in jobs: it keeps no beat going)
            self.ledger.heartbeat(waiters.waiter_id())
            next_beat = now + waiters.HEARTBEAT_SECONDS
        lanes = {w.lane for w in jobs if not w.event.is_set()}
        if safety and jobs:
            next_safety = now + SAFETY_SECONDS
            if self.ledger.lease_expired():
                self.ledger.reap()  # hands the room on in its own transaction
        for lane in sorted(lanes & (retick | _room_lanes(notified) | (lanes if safety else set()))):
            _, busy = self.ledger.try_tick(lane, gated=True)  # it runs none of what it leases
            if busy:
                # tried again RETICK_SECONDS later, as a timed tick: tried again at the watcher's next wake-up of any
                # kind (another schema's NOTIFY on the shared channel), it ticked about as fast as a busy loop
                self._set_timer(lane, time.monotonic() + RETICK_SECONDS)
        if not jobs:
            next_safety = next_beat = now  # the next waiter starts with a heartbeat
        return next_safety, next_beat

    def _read(self, jobs: list[Waiting], listener=None) -> None:
        waiting = [w for w in jobs if not w.event.is_set()]
        if not waiting:
            return
        ids = [w.job_id for w in waiting]
        # PostgreSQL: on the listening connection itself, never queued behind the pool's busy threads
        got = listener.rows(ids) if listener is not None else self.ledger.waiting_rows(ids)
        for row in got:
            w = self._jobs.get(row[0])
            if w is None:
                continue
            if row[waiters.ROW_KEYS.index("state")] != "new":
                w.sent = listener is not None
                w.row = row
                w.event.set()
            elif row[waiters.ROW_KEYS.index("lane")] != w.lane:  # a tick moved it to its fallback lane: tick that one
                w.lane = row[waiters.ROW_KEYS.index("lane")]
                self._retick.add(w.lane)


def _room_lanes(notified: set[tuple]) -> set[str]:
    return {lane for lane, kind, _ in notified if kind == "room"}


class _Listener:
    """PostgreSQL: one autocommit connection ``LISTEN``ing on the lane channel."""

    def __init__(self, ledger):
        import psycopg

        self.db = ledger.db
        self.ledger = ledger
        self.conn = psycopg.connect(**{"connect_timeout": 10, **ledger.url.conninfo}, autocommit=True)
        self.conn.execute(queries.listen(waiters.CHANNEL))
        self.schema = self.conn.execute(queries.CURRENT_SCHEMA).fetchone()[0]

    def wait(self, timeout: float) -> set[tuple]:
        """Notifications for this schema from other processes within ``timeout``: ``(lane, kind, ids)`` each
        (:func:`waiters.parse_what`)."""
        out: set[tuple] = set()
        got = list(self.conn.notifies(timeout=max(timeout, 0.001), stop_after=1))
        if got:
            got += list(self.conn.notifies(timeout=0.001))  # drain what came with it
        own = self.db.backend_pids
        for n in got:
            schema, _, rest = n.payload.partition("|")
            if schema == self.schema and n.pid not in own:
                out.add(waiters.parse_what(rest))
        return out

    def rows(self, job_ids: list[str]) -> list[tuple]:
        """The waiting jobs' own rows, read on this connection (autocommit: one statement, one transaction);
        the leased ones' rate charges stamped in the same statement (:func:`waiters.rows_sent`)."""
        from .db import Cursor

        with self.conn.cursor() as raw:
            cur = Cursor(raw, "postgresql", self.db.clock, self.db.stats)
            out = waiters.rows_sent(cur, job_ids, self.ledger._now(cur), self.ledger.send_slack)
        self.db.stats.commits += 1
        return out

    def close(self) -> None:
        try:
            self.conn.close()
        except Exception:
            pass


__all__ = ["POLL_SQLITE", "SAFETY_SECONDS", "STALL_SECONDS", "Latch", "Waiting", "Wakeups"]
