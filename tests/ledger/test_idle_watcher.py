"""A wake-up watcher with nothing to watch waits for the next waiter; it does not spin.

The watcher stays up for ``_IDLE_EXIT`` (5 s) after its last waiter left, so that the next one does not
start a thread. It used to spend those seconds in a busy loop: with no job its next safety poll was
"now", so each cycle waited 0 s and went round again, a core burnt for 5 s after every wait in every
process (and the gated threads' own work slowed behind it for the GIL). Found measuring the test
suite's CPU: a billing test of a second burned 3 s in that thread.
"""

from __future__ import annotations

import time

from lane_plugin import Ledger
from lane_plugin.ledger import wakeups


def test_an_idle_watcher_waits_and_sees_a_new_waiter(ledger_url, monkeypatch):
    led = Ledger(ledger_url)
    led.set_lane("p", allowance=10**6, ceiling=10**6, start_fraction=1.0, max_leased=1, lease_seconds=60)
    led.submit("s", 100, "p")
    [first] = led.tick("p")  # the one slot taken: the next job waits
    job = led.submit("s", 100, "p")
    cycles = []
    real_cycle = led.wakeups._cycle
    monkeypatch.setattr(led.wakeups, "_cycle", lambda *a: cycles.append(time.monotonic()) or real_cycle(*a))
    led.wakeups.register(job, "p")
    time.sleep(0.3)
    led.wakeups.unregister(job)
    assert led.wakeups._thread is not None and led.wakeups._thread.is_alive(), "the watcher really ran"
    time.sleep(0.2)  # the cycle under way ends
    idle_from = len(cycles)
    time.sleep(1.0)
    assert led.wakeups._thread is not None and led.wakeups._thread.is_alive(), "still up: it waits for _IDLE_EXIT"
    idle = len(cycles) - idle_from
    # one cycle per POLL_SQLITE, or per TIMER_SLICE on PostgreSQL's LISTEN wait (a NOTIFY from another test on
    # the same database wakes it early too): tens, where the busy loop made 200,000
    assert idle <= 4 / wakeups.TIMER_SLICE, f"{idle} cycles in 1 s with nothing to watch"

    # a waiter registered while the watcher idles is read promptly (the register's message wakes it): its job,
    # leased by another connection meanwhile, is seen by the watcher's next read
    other = Ledger(ledger_url)
    other.settle(first.job_id, 100, attempt=first.attempt, outcome="done")
    assert [lease.job_id for lease in other.tick("p")] == [job]
    other.close()
    w = led.wakeups.register(job, "p")
    t0 = time.monotonic()
    try:
        assert w.event.wait(2.0), "the job leased by another connection was never seen"
        assert time.monotonic() - t0 < 1.0, time.monotonic() - t0
    finally:
        led.wakeups.unregister(job)
    led.close()
