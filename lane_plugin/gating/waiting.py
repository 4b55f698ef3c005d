"""A waiting gate's two edge cases: its job's row changed, and its wait ended by an exception."""

from __future__ import annotations

from ..errors import JobParked
from ..ledger.waiters import ROW_KEYS, WAITER_GONE
from . import timeouts
from .ledgers import run_logger
from .renewal import renewer


def take(led, job_id: str, w):
    """The job's row changed (``w``'s event): its lease (picked up now), or None if it waits on.

    A job parked as ``waiter gone`` while its waiter is still here (a stalled process was taken
    for dead) goes back to the queue; any other parking raises :class:`JobParked`.
    """
    w.event.clear()
    row, w.row, sent = w.row, None, w.sent
    if row is None:
        row, sent = led.waiting_rows([job_id])[0], False
    try:
        return led.take(row, sent=sent)
    except JobParked:
        reason = row[ROW_KEYS.index("reason")] or ""
        if row[ROW_KEYS.index("state")] == "parked" and reason.startswith(WAITER_GONE):
            led.requeue(job_id)
            return None  # (the wait's next turn watches it again: Wakeups.keep)
        raise


def abandon(led, gate, exc: BaseException) -> None:
    """The wait ended by an exception (a timeout, a cancellation): nobody waits for the job any more.

    It is parked (``waiter gone``) rather than left waiting for a later tick to lease it to nobody;
    leased just as the wait ended, it is settled with nothing spent (its body never ran), and the rate charge
    it was handed with leaves the burst window (its request never went out).
    """
    if gate.job_id is None or isinstance(exc, JobParked):
        return
    led.wakeups.unregister(gate.job_id)  # (again: the exception may have landed before the wait's own)
    if gate.lease is not None:
        _give_back(led, gate, exc)
        return
    try:
        with timeouts.shield():
            if led.park(gate.job_id, f"{WAITER_GONE}: its wait ended with {type(exc).__name__}"):
                return
            job = led.job(gate.job_id)
            if job["state"] == "leased":
                led.settle(gate.job_id, 0, attempt=job["attempt"], outcome="failed", unsent=True)
    except Exception as err:  # its waiter is gone anyway: the ledger drops the job in a few seconds
        run_logger().warning("lane gate: could not release job %s after %s: %s", gate.job_id, type(exc).__name__, err)


def _give_back(led, gate, exc: BaseException) -> None:
    """Leased, picked up, and the body never ran (a timeout landed in the admission, or its renewal could not
    start): stop renewing the lease and settle the attempt with nothing spent, so neither its slot nor its
    reserve is held until the lease expires (or, renewed, for ever); then close the gate's timeout shield."""
    held, gate._held = gate._held, None
    if held is not None:
        renewer().release(held)
    try:
        with gate._shield, timeouts.shield():  # a timeout deferred by the gate's shield is raised after this
            gate.settled = led.settle(gate.job_id, 0, attempt=gate.lease.attempt, outcome="failed")
    except Exception as err:  # the lease expires on its own: it is no longer renewed
        run_logger().warning("lane gate: could not release job %s after %s: %s", gate.job_id, type(exc).__name__, err)
