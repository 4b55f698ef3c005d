"""A wake-up watcher with nothing to watch waits for the next waiter; it does not spin.

The watcher stays up for ``_IDLE_EXIT`` (5 s) after its last waiter left, so that the next one does not
start a thread. It used to spend those seconds in a busy loop: with no job its next safety poll was
"now", so each cycle waited 0 s and went round again, a core burnt for 5 s after every wait in every
process (and the gated threads' own work slowed behind it for the GIL). Found measuring the test
suite's CPU: a billing test of a second burned 3 s in that thread.
"""

from __future__ import annotations

import concurrent.futures
import threading
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

    # a waiter registered while the watcher idles is read at once: the register's message wakes it (SQLite; with a
    # poll of 5 s, a watcher not woken would see the job seconds later), PostgreSQL's idle watcher looks every
    # TIMER_SLICE. Its job, leased by another connection meanwhile, is seen by that first read.
    monkeypatch.setattr(wakeups, "POLL_SQLITE", 5.0)
    time.sleep(wakeups.RETICK_SECONDS * 5)  # the watcher is in its idle wait (now up to 5 s long)
    other = Ledger(ledger_url)
    other.settle(first.job_id, 100, attempt=first.attempt, outcome="done")
    assert [lease.job_id for lease in other.tick("p")] == [job]
    other.close()
    w = led.wakeups.register(job, "p")
    t0 = time.monotonic()
    try:
        assert w.event.wait(2.0), "the job leased by another connection was never seen"
        assert time.monotonic() - t0 < 1.0, time.monotonic() - t0  # not the 5 s poll
    finally:
        led.wakeups.unregister(job)
    led.close()


def _wake_ups_elsewhere(led: Ledger, stop: threading.Event) -> int:
    """Wake the watcher every 2 ms with news of nothing it waits for: another schema's NOTIFY on the shared channel
    (PostgreSQL), a retick of a lane nobody here waits on (both). Returns how many were sent."""
    sent, conn = 0, None
    if led.db.dialect == "postgresql":
        import psycopg

        conn = psycopg.connect(**led.url.conninfo, autocommit=True)
    try:
        while not stop.is_set():
            if conn is not None:
                conn.execute("select pg_notify('lane_plugin', 'another_schema|p|room')")
            led.wakeups.retick("a-lane-nobody-waits-on")
            sent += 1
            time.sleep(0.002)
    finally:
        if conn is not None:
            conn.close()
    return sent


def test_a_watcher_whose_tick_finds_another_running_tries_again_after_retick_seconds(ledger_url, monkeypatch):
    """A tick of the watcher that found another running (another thread of the process, or another process, ticking
    the lane) is tried again RETICK_SECONDS later, however often the watcher is woken meanwhile. It was tried again
    at once: a busy loop for as long as the other tick ran (on PostgreSQL one transaction a turn); then at the
    watcher's next wake-up of any kind (CI: 67 ticks in a second, woken by other tests' NOTIFYs)."""
    led = Ledger(ledger_url)
    led.set_lane("p", allowance=10**6, ceiling=10**6, start_fraction=1.0, max_leased=1, lease_seconds=60)
    led.submit("s", 100, "p")
    assert len(led.tick("p")) == 1
    job = led.submit("s", 100, "p")
    ticks = []
    monkeypatch.setattr(led, "try_tick", lambda lane, **kw: ticks.append(time.monotonic()) or ([], True))  # busy
    led.wakeups.register(job, "p")
    led.wakeups.retick("p")  # what a gate whose own tick was busy asks for
    stop = threading.Event()
    noise = concurrent.futures.ThreadPoolExecutor(1).submit(_wake_ups_elsewhere, led, stop)
    time.sleep(1.0)
    stop.set()
    woken = noise.result(5)
    led.wakeups.unregister(job)
    assert woken >= 100, f"the watcher was woken only {woken} times"
    assert len(ticks) >= 5, "the watcher really ticked, and kept finding the lane busy"
    # one tick per RETICK_SECONDS (20 ms) at most: 50 in a second, where the busy loop made thousands
    assert len(ticks) <= 1.0 / wakeups.RETICK_SECONDS + 10, (
        f"{len(ticks)} ticks in 1 s of a busy lane ({woken} wake-ups)"
    )
    led.close()


def test_a_woken_waiter_never_unregistered_is_let_go(ledger_url, monkeypatch):
    """A gate interrupted between its wake-up and its unregister (a second exception raised into its thread, in the
    finally or in abandon) left its entry in the watcher's map for good: the watcher never idled out, and it beat
    the process's waiter heartbeat for ever. Woken and still registered after STALE_WOKEN_SECONDS, it is let go; a
    waiter that waits on after its wake-up (its job went back to the queue) is watched again by ``resume``."""
    monkeypatch.setattr(wakeups, "STALE_WOKEN_SECONDS", 0.5)
    monkeypatch.setattr(wakeups, "_IDLE_EXIT", 0.3)
    led = Ledger(ledger_url)
    led.set_lane("p", allowance=10**6, ceiling=10**6, start_fraction=1.0, max_leased=2, lease_seconds=60)
    stuck = led.submit("s", 100, "p")
    led.submit("s", 100, "p")
    beats = []
    real_beat = led.heartbeat
    monkeypatch.setattr(led, "heartbeat", lambda waiter: beats.append(time.monotonic()) or real_beat(waiter))
    cycles = []
    real_cycle = led.wakeups._cycle
    monkeypatch.setattr(led.wakeups, "_cycle", lambda *a: cycles.append(time.monotonic()) or real_cycle(*a))
    w = led.wakeups.register(stuck, "p")
    # Lease both: this process's commit wakes the registered one at once. A tick that finds the watcher (started by
    # the register) ticking the lane returns at once having done nothing, and the watcher's gated tick leases no job
    # nobody waits for: tick again until this one ran (CI under load once found it busy, and nothing woke the waiter).
    deadline = time.monotonic() + 5.0
    while led.try_tick("p")[1] and time.monotonic() < deadline:
        time.sleep(0.01)
    assert w.event.wait(5.0), "the waiter was really woken"
    watcher = led.wakeups._thread
    assert watcher is not None and watcher.is_alive()
    time.sleep(0.2)
    assert stuck in led.wakeups._jobs, "the interrupted gate's entry is still there (it never unregistered)"

    deadline = time.monotonic() + 5.0
    while stuck in led.wakeups._jobs and time.monotonic() < deadline:
        time.sleep(0.05)
    assert stuck not in led.wakeups._jobs, "the woken entry was never let go"
    gone_at = time.monotonic()
    # while it was kept (woken, not yet stale) the watcher waited between cycles: a beat schedule left in the past
    # (no beat with every entry woken) made it a busy loop of thousands of cycles a second
    assert len(cycles) <= 2 / wakeups.TIMER_SLICE, f"{len(cycles)} cycles while one woken entry was kept"
    while watcher.is_alive() and time.monotonic() < deadline + 2.0:
        time.sleep(0.05)
    assert not watcher.is_alive(), "the watcher never idled out"
    assert not [b for b in beats if b > gone_at], "it heart-beat with nothing waiting"

    # a waiter woken and then put back to wait (what waiting.take does for a job requeued after "waiter gone")
    live = led.submit("s", 100, "p")  # both slots are taken: it waits
    w2 = led.wakeups.register(live, "p")
    w2.event.set()
    time.sleep(0.8)  # stale: let go
    assert live not in led.wakeups._jobs
    w2.event.clear()
    led.wakeups.resume(w2)
    assert led.wakeups._jobs.get(live) is w2, "resume watches it again"
    time.sleep(0.8)
    assert led.wakeups._jobs.get(live) is w2, "an un-woken waiter is never let go"
    led.wakeups.unregister(live)
    led.close()
