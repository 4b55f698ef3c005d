"""A gate waiting for admission: one look at a time (a tick, a wake-up, the lease), where it stands logged
now and then, and its admission deadline (the fallback lane, else parked); a mixin of
:class:`lane_plugin.gating.context.Gate`."""

from __future__ import annotations

import time
from typing import Any

from ..errors import JobParked
from ..ledger import Lease, Ledger
from ..ledger.wakeups import Waiting
from . import tokenlog, waiting
from .ledgers import run_logger

LOG_FIRST = 1.0  # a waiting job first logs where it stands after this long
LOG_EVERY = 10.0  # ... and then at least this often


class AdmissionWait:
    """The waiting side of :class:`~lane_plugin.gating.context.Gate`."""

    stage: str
    lane: str
    job_id: str | None
    lease: Lease | None
    wait_seconds: float | None

    @property
    def _job(self) -> str:
        assert self.job_id is not None, "a gate's job exists once its intake wrote it"  # (for the type checker)
        return self.job_id

    def _poll(self, led: Ledger, state: dict[str, Any], w: Waiting) -> float | None:
        """One look: None once leased, else how long to wait for a wake-up (the event cuts it short)."""
        lease = None
        if state.pop("first", False):  # just submitted: one tick usually admits it
            w.lane = state.get("lane", self.lane)  # its fallback lane, once it fell back
            leases, busy = led.try_tick(w.lane, gated=True)
            lease = next((x for x in leases if x.job_id == self.job_id), None)
            if lease is None and busy:  # another tick is running: it (or the watcher, shortly) leases what fits
                led.wakeups.retick(w.lane)
            elif lease is None and not w.event.is_set():
                # Leased already? Another thread's tick or hand-off between the intake's commit and the register
                # found no waiter to wake, and this tick leases only what is new: one look at the row, or the
                # wait lasted until the watcher's next read of it (PostgreSQL: its 1 s safety poll).
                lease = waiting.take(led, self._job, w)
        if lease is None and w.event.is_set():  # leased by a tick or a hand-off, here or in another process
            lease = waiting.take(led, self._job, w)
        if lease is not None:
            self.lease = lease
            return None
        now = time.monotonic()
        if self.wait_seconds is not None and now - state["t0"] >= self.wait_seconds:
            self._give_up(led, state)
            return 0.0 if self.lease is None else None
        if now >= state["next_log"]:
            self._log_wait(led, now - state["t0"])
            state["next_log"] = now + LOG_EVERY
        sleep = state["next_log"] - now
        if self.wait_seconds is not None:
            sleep = min(sleep, max(0.0, state["t0"] + self.wait_seconds - now) + 0.01)
        return max(sleep, 0.0)

    def _log_wait(self, led: Ledger, waited: float) -> None:
        tokenlog.waiting(run_logger(), led, stage=self.stage, job_id=self._job, waited=waited)

    def _give_up(self, led: Ledger, state: dict[str, Any]) -> None:
        s = led.wait_status(self._job)
        moved_to = led.give_up_waiting(self._job, f"admission deadline of {self.wait_seconds:g}s passed")
        if moved_to is not None:
            run_logger().warning(
                "lane gate: %s job waited %.1fs in lane %r (remaining %d); falling back to lane %r",
                self.stage,
                self.wait_seconds,
                s["lane"],
                s["remaining"],
                moved_to,
            )
            state.update(t0=time.monotonic(), first=True, lane=moved_to)  # tick the fallback lane now
            return
        try:
            self.lease = led.acquire(self._job)  # admitted while we were giving up?
        except JobParked:
            self.lease = None
        if self.lease is not None:
            return
        msg = (
            f"job {self.job_id} (stage {self.stage!r}, estimate {s['est']} tokens) parked in lane {s['lane']!r}: "
            f"not admitted within its deadline of {self.wait_seconds:g}s; {s['remaining']} tokens remained of "
            f"ceiling {s['ceiling']} (spent {s['spent']}, reserved {s['reserved']}), blocked by "
            f"{s['blocked_by'] or 'jobs ahead'}, {s['waiting']} job(s) waiting"
        )
        run_logger().error("lane gate: %s", msg)
        raise JobParked(msg, job_id=self.job_id, lane=s["lane"], est=s["est"], remaining=s["remaining"])
