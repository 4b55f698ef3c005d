"""Regressions for races found while writing the fault suite (PostgreSQL: intake and upkeep
are not serialised there the way BEGIN IMMEDIATE serialises them on SQLite)."""

from __future__ import annotations

import threading
import time

import pytest

from lane_plugin import Ledger
from lane_plugin.ledger import admission

from .conftest import assert_audit_clean, make_lane


@pytest.mark.postgres
def test_fallback_move_during_a_tick_cannot_lease_a_job_into_the_wrong_lane(pg_url, monkeypatch):
    """A job moved to its fallback lane while a tick of its old lane was choosing it was leased
    against the old lane's budget and settled against the new one's (I2 broken in both)."""
    led = Ledger(pg_url)
    make_lane(led, "paid", ceiling=10_000)
    make_lane(led, "free", ceiling=1000, fallback="paid")
    job = led.submit("s", 10, "free", fallback=True)
    real_admit = admission.admit  # the policy's admit, as the ledger's tick calls it
    chosen = threading.Event()

    def slow_admit(*a, **kw):
        decision = real_admit(*a, **kw)
        chosen.set()
        time.sleep(1.0)  # widen the window between choosing and leasing
        return decision

    monkeypatch.setattr(admission, "admit", slow_admit)
    ticker = Ledger(pg_url)
    leases = []
    t = threading.Thread(target=lambda: leases.extend(ticker.tick("free")))
    t.start()
    assert chosen.wait(10)
    moved_to = Ledger(pg_url).give_up_waiting(job, "deadline passed")
    t.join()
    state = led.job(job)
    assert (moved_to is None) == bool(leases), (moved_to, leases)  # exactly one of the two won
    if leases:
        assert state["lane"] == "free" and state["state"] == "leased"
        led.settle(leases[0], 10)
    else:
        assert state["lane"] == "paid" and state["state"] == "new"
    assert_audit_clean(led)
