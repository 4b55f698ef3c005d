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

import logging
import threading
import time
from dataclasses import dataclass, field

from ..errors import LeaseLost

log = logging.getLogger("lane_plugin.renewer")
MIN_INTERVAL = 0.05


@dataclass(eq=False)
class Held:
    """A lease being kept alive; ``lost`` turns True if a renewal found it gone."""

    ledger: object
    lease: object
    logger: object
    interval: float
    renew_at: float
    lost: bool = False
    lease_until: float = field(default=0.0)


class Renewer:
    """Renews every held lease from one daemon thread (started on first use)."""

    def __init__(self):
        self._held: set[Held] = set()
        self._cv = threading.Condition()
        self._thread: threading.Thread | None = None
        self._lease_seconds: dict[tuple[int, str], tuple[float, float]] = {}
        self._wake_at = 0.0  # when the thread wakes next (monotonic)

    def _interval(self, ledger, lane: str) -> float:
        key, now = (id(ledger), lane), time.monotonic()
        cached = self._lease_seconds.get(key)
        if cached is None or now - cached[1] > 30.0:
            cached = (float(ledger.lane(lane).lease_seconds), now)
            self._lease_seconds[key] = cached
        return max(MIN_INTERVAL, cached[0] / 3.0)

    def hold(self, ledger, lease, logger=None) -> Held:
        """Start keeping ``lease`` alive; returns the handle to :meth:`release`."""
        interval = self._interval(ledger, lease.lane)
        held = Held(ledger, lease, logger or log, interval, time.monotonic() + interval, lease_until=lease.lease_until)
        with self._cv:
            self._held.add(held)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="lane-lease-renewer", daemon=True)
                self._thread.start()
            elif held.renew_at < self._wake_at:
                self._cv.notify()  # due before the thread next wakes (short leases only)
        return held

    def release(self, held: Held) -> None:
        """Stop renewing (the body finished); idempotent."""
        with self._cv:
            self._held.discard(held)

    def _run(self) -> None:
        while True:
            with self._cv:
                now = time.monotonic()
                due = [h for h in self._held if h.renew_at <= now]
                if not due:
                    nxt = min((h.renew_at for h in self._held), default=now + 5.0)
                    self._wake_at = now + max(0.01, min(nxt - now, 5.0))
                    self._cv.wait(self._wake_at - now)
                    self._wake_at = 0.0
                    continue
            for held in due:
                self._renew(held)

    def _renew(self, held: Held) -> None:
        lease = held.lease
        try:
            held.lease_until = held.ledger.renew(lease.job_id, lease.token)
            held.renew_at = time.monotonic() + held.interval
        except LeaseLost as exc:
            with self._cv:
                if held not in self._held:
                    return  # the body finished and settled meanwhile: not a loss
                self._held.discard(held)
            held.lost = True
            held.logger.error(
                "LEASE LOST: job %s (stage %r, lane %r, estimate %d, attempt %d) no longer holds its lease: %s. "
                "The body keeps running and its tokens will still be billed (late), but the lane may have "
                "admitted other work into its room.",
                lease.job_id, lease.stage, lease.lane, lease.est, lease.attempt, exc,
            )  # fmt: skip
        except Exception as exc:  # the database is briefly unavailable: try again soon
            held.renew_at = time.monotonic() + max(MIN_INTERVAL, held.interval / 4)
            held.logger.warning("lease renewal of job %s failed (%s); retrying", lease.job_id, exc)


_renewer = Renewer()


def renewer() -> Renewer:
    """The process's renewer."""
    return _renewer


__all__ = ["Held", "Renewer", "renewer"]
