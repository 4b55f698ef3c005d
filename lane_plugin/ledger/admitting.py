"""The :class:`~lane_plugin.Ledger`'s admission side: ticks (one ticker per lane), hand-offs, wake-ups.

A part of :class:`~lane_plugin.Ledger`, composed into it (it uses the ledger's ``_run``, ``_emit`` and ``db``);
the transactions' work is in :mod:`~lane_plugin.ledger.admission` and :mod:`~lane_plugin.ledger.waiters`.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from ..checks import text
from ..errors import JobParked
from . import admission, leases, queries, rates, runs, upkeep, waiters
from .db import Busy
from .jobs import Lease
from .lanes import LaneRow, lock_lane, read_lane

# A tick claim this old was left by an interrupted thread (a tick takes ms; the try-lock 50 ms): taken over.
STALE_TICK_SECONDS = 0.2


class Admitting:
    """Ticks, hand-offs and what a waiting gate asks of one :class:`~lane_plugin.Ledger` (its part, composed:
    the ledger's methods of the same names call these)."""

    def __init__(self, ledger: Any) -> None:  # the Ledger (api.py imports this module)
        from .wakeups import Wakeups

        self.led = ledger
        self._specs: dict[str, tuple[float, LaneRow]] = {}
        self._tick_claims: dict[str, tuple[str, float]] = {}  # lane -> (tick token, since): this process's ticker
        self.wakeups = Wakeups(ledger)

    def tick(self, lane: str = "free") -> list[Lease]:
        return self.led.try_tick(lane)[0]

    def try_tick(self, lane: str = "free", *, gated: bool = False, own: str | None = None) -> tuple[list[Lease], bool]:
        lane = text("lane", lane)
        spec = self._lane_spec(lane)
        ok, err, fresh = self.led.preflight.check(lane, spec.preflight, spec.preflight_timeout)
        if fresh or not ok:
            moved = self.led._run(lambda cur, now: self._record_preflight(cur, now, lane, ok, err))
            if not ok and fresh:
                self.led._emit("lane.preflight.failed", lane, {"error": err, "fell_back": moved})
        token = uuid.uuid4().hex
        # One ticker per lane in this process: a claim made by one C call (dict.setdefault), not a lock, so an
        # exception raised into the ticking thread at any bytecode cannot keep the lane from ticking for ever:
        # a claim older than STALE_TICK_SECONDS is taken over (the database serialises ticks anyway).
        mine = (token, time.monotonic())

        def run(cur):
            if not waiters.try_tick_lock(cur, lane):  # another process is ticking it (PostgreSQL)
                raise Busy()
            return admission.tick(
                cur,
                lane,
                now=self.led._now(cur),
                token=token,
                send_slack=self.led.send_slack,
                holder=waiters.waiter_id(),
                gated=gated,
                own=own,
            )

        try:
            held = self._tick_claims.setdefault(lane, mine)
            if held is not mine:
                if mine[1] - held[1] < STALE_TICK_SECONDS:
                    return [], True  # another thread of this process is ticking this lane
                self._tick_claims[lane] = mine
            ticked = self.led.db.transaction(run, try_lock=True)
        except Busy:
            return [], True
        finally:
            if self._tick_claims.get(lane) is mine:
                self._tick_claims.pop(lane, None)
        self._admitted(lane, ticked)
        if ticked.refit_due:  # outside the admission transaction: the tick stays short
            self.led._run(lambda cur, now: runs.refit(cur, lane, now))
        return ticked.leases, False

    def _admitted(self, lane: str, ticked: admission.Ticked) -> None:
        """After a commit that leased (a tick, a hand-off): events, this process's waiters woken, and a
        timed tick for when the burst window will have slid far enough for a job still waiting on it."""
        leases, decision, before, parked = ticked.leases, ticked.decision, ticked.row, ticked.parked
        if ticked.retry_in is not None:
            self.led.wakeups.tick_at(lane, ticked.retry_in)
        for tail in parked:  # cannot fit before the next reset (the lane has no period), or waiter gone
            self.led._emit("lane.job.parked", tail["lane"], tail)
        if not leases:
            return
        self.led.wakeups.wake(leases)
        # (a payload only for someone to hear it: building one per lease costs a tenth of a cycle)
        if self.led.listeners:
            for lease in leases:
                self.led._emit("lane.job.admitted", lane, {**vars(lease), "token": None})
        committed_before = before.spent + before.reserved
        limit = before.policy.start_limit
        if committed_before < limit <= committed_before + decision.tokens:
            self.led._emit(
                "lane.lane.start-stop",
                lane,
                {
                    "start_limit": limit,
                    "ceiling": before.ceiling,
                    "committed": committed_before + decision.tokens,
                    "spent": before.spent,
                },
            )

    def hand_off(
        self, cur, now: float, lane: str, token: str, *, freed: bool = True, row: LaneRow | None = None
    ) -> admission.Ticked | None:
        """Inside a settlement's or a reap's transaction: lease the gated jobs that now fit.

        ``row``: the lane's row as this transaction last wrote it, locked (a settlement's), or None to lock it.

        Skipped (None) when no gated job waits in the lane (the tick's first read, of ``ix_job_gated``'s head,
        under the lane's lock, is empty): a hand-off leases only gated jobs and parks only the jobs of gone
        waiters, so it could do neither; what else it would do, slide the burst window and lapse quiet runs'
        reserves, every tick does first, and its ``room`` NOTIFY is for the waiters of this lane's jobs, of
        which there are none.
        """
        if not freed:
            return None
        handed = admission.tick(cur, lane, now=now, token=token, handoff=True, row=row, send_slack=self.led.send_slack)
        if handed is None:
            return None
        if not handed.leases:
            waiters.notify(cur, lane, "room")  # other processes' waiters may tick (a safety net)
        return handed

    def handed(self, lane: str, handed: admission.Ticked | None) -> None:
        if handed is not None:
            self._admitted(lane, handed)

    def _lane_spec(self, lane: str) -> LaneRow:
        """The lane's preflight settings, re-read at most every few seconds (not per tick)."""
        hit = self._specs.get(lane)
        if hit is None or time.monotonic() - hit[0] > self.led.preflight.ttl:
            hit = (time.monotonic(), self.led._run(lambda cur, now: read_lane(cur, lane), write=False))
            self._specs[lane] = hit
        return hit[1]

    def _record_preflight(self, cur, now, lane, ok, err) -> int:
        lock_lane(cur, lane)
        cur.execute(
            queries.ADMITTING_RECORD_PREFLIGHT,
            {"ok": ok, "err": err, "now": now, "l": lane},
        )
        return 0 if ok else upkeep.fall_back_waiting(cur, lane, now=now)

    def acquire(self, job_id: str) -> Lease | None:
        job = self.led.job(job_id)
        if job["state"] == "new":  # leases the waiters' jobs and this one, never another's it would drop
            self.led.try_tick(job["lane"], gated=True, own=job_id)
            job = self.led.job(job_id)
        return self.led.take(tuple(job[k] for k in waiters.ROW_KEYS))

    def take(self, row: tuple, *, sent: bool = False) -> Lease | None:
        job = dict(zip(waiters.ROW_KEYS, row))
        job_id = job["id"]
        if job["state"] == "leased":  # its request goes out now: the rate window counts it from now (+ send slack)
            if not sent:
                self.led._run(lambda cur, now: rates.stamp_sent(cur, job_id, job["attempt"], now, self.led.send_slack))
            return Lease(
                job["id"],
                job["lane"],
                job["stage"],
                job["est"],
                job["attempt"],
                job["lease_token"],
                job["lease_until"],
                job["run_key"],
                job["rate_cost"],
            )
        if job["state"] in ("parked", "failed", "done"):
            raise JobParked(
                f"job {job_id} ({job['stage']!r}, {job['est']} tokens) in lane {job['lane']!r} is "
                f"{job['state']}: {job['reason'] or 'no reason recorded'}",
                job_id=job_id,
                lane=job["lane"],
                est=job["est"],
            )
        return None

    # -- what a waiting process asks (its watcher thread, lane_plugin.ledger.wakeups) ---------------------
    def waiting_rows(self, job_ids: list[str]) -> list[tuple]:
        return self.led._run(lambda cur, now: waiters.rows(cur, job_ids), write=False)

    def heartbeat(self, waiter: str) -> None:
        self.led._run(lambda cur, now: waiters.heartbeat(cur, waiter, now))

    def lease_expired(self) -> bool:

        def look(cur, now):
            return waiters.lease_expired(cur, now) or leases.out_of_bounds(cur, now)

        return self.led._run(look, write=False)
