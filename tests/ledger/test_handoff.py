"""Issue 14: hand-off at settle and reap, wake-ups, one ticker per lane; issue 10 item 5: waiters that are gone.

On both databases (``ledger_url``). A *gated* job is one submitted with a ``waiter`` (what the gate
does); a job without one was submitted from the CLI and is pulled by whoever ticks.
"""

from __future__ import annotations

import threading
import time

import pytest

from lane_plugin import Ledger
from lane_plugin.ledger import admission, wakeups
from lane_plugin.ledger.waiters import GONE_SECONDS, WAITER_GONE


def lane(led, **kw):
    settings = dict(
        allowance=100_000,
        ceiling=100_000,
        start_fraction=1.0,
        burst_tokens=100_000,
        max_leased=1,
        lease_seconds=30,
        max_attempts=3,
        max_wait_seconds=600,
    )
    settings.update(kw)
    return led.set_lane("h", **settings)


def state(led, job_id: str) -> tuple:
    j = led.job(job_id)
    return j["state"], j["attempt"]


def test_a_settlement_hands_its_room_to_the_next_gated_job_in_its_own_transaction(led, clock):
    lane(led)
    a = led.submit("s", 100, "h", waiter="w1")
    clock.t += 1
    b = led.submit("s", 100, "h", waiter="w1")
    [lease] = led.tick("h")
    assert lease.job_id == a and state(led, b) == ("new", 1)
    commits = led.db.stats.commits
    led.settle(lease, 90)
    assert led.db.stats.commits - commits == 1  # the settlement and the hand-off: one transaction
    assert state(led, b) == ("leased", 1)
    assert led.tick("h") == []  # nothing left for a tick to do
    row = led.lane("h")
    assert (row.leased, row.reserved, row.spent) == (1, 100, 90)
    assert led.audit() == []


def test_a_hand_off_passes_a_cli_job_by_and_leaves_it_to_an_explicit_tick(led):
    """The hand-off runs no job itself: it leases what a waiter waits for, never a CLI job (whose lease it
    would drop), and a CLI job first in the order does not hold the gated jobs behind it back."""
    lane(led)
    x = led.submit("s", 100, "h", waiter="w1")
    [lx] = led.tick("h")
    cli = led.submit("s", 50, "h")  # smaller: first in the order, and nobody waits for it
    gated = led.submit("s", 100, "h", waiter="w1")
    led.settle(lx, 100)
    assert state(led, cli) == ("new", 1) and state(led, gated) == ("leased", 1)
    assert led.tick("h") == []  # the lane's one slot is the gated job's
    led.settle(led.acquire(gated), 100)  # nothing gated waits: the hand-off leases nothing
    assert state(led, cli) == ("new", 1)
    [lc] = led.tick("h")  # an explicit tick (`lane tick`) leases the CLI job to its caller
    assert lc.job_id == cli and lc.attempt == 1
    assert x == lx.job_id and led.audit() == []


def test_a_gated_tick_leaves_cli_jobs_waiting_in_their_place(led):
    """The tick a gate or the waiters' watcher runs (``gated``) leases only jobs a waiter waits for: before,
    it leased CLI jobs too and dropped their leases, which expired unrun and cost each an attempt."""
    lane(led, max_leased=3)
    cli = led.submit("s", 50, "h")  # first in the order
    gated = led.submit("s", 100, "h", waiter="w1")
    leases, busy = led.try_tick("h", gated=True)
    assert not busy and [x.job_id for x in leases] == [gated]
    assert state(led, gated) == ("leased", 1) and state(led, cli) == ("new", 1)
    [lc] = led.tick("h")
    assert lc.job_id == cli
    assert led.audit() == []


def test_acquire_leases_its_own_job_and_not_another_nobody_waits_for(led):
    """``Ledger.acquire`` (a script polling for its job) ticks for its job: another script's job stays
    waiting for that script's own poll, never leased to a caller that drops it."""
    lane(led, max_leased=3)
    other = led.submit("s", 50, "h")  # first in the order
    mine = led.submit("s", 100, "h")
    lease = led.acquire(mine)
    assert lease is not None and lease.job_id == mine
    assert state(led, other) == ("new", 1)
    assert led.acquire(other).job_id == other
    assert led.audit() == []


def test_a_reap_parks_the_gone_waiters_jobs_and_hands_the_room_on(led, clock):
    lane(led, max_leased=2, lease_seconds=10)
    dead1 = led.submit("s", 100, "h", waiter="dead")
    dead2 = led.submit("s", 100, "h", waiter="dead")
    assert {x.job_id for x in led.tick("h")} == {dead1, dead2}
    dead3 = led.submit("s", 100, "h", waiter="dead")  # waits, its waiter about to die
    cli = led.submit("s", 100, "h")
    [lcli] = led.tick("h") or [None]
    assert lcli is None  # two slots, both held
    clock.t += 11  # the dead waiter's leases expire unrenewed
    led.heartbeat("alive")
    live = led.submit("s", 100, "h", waiter="alive")
    moved = led.reap()
    for j in (dead1, dead2, dead3):
        assert state(led, j) == ("parked", 1)
        assert led.job(j)["reason"].startswith(WAITER_GONE)
    assert {t["job_id"] for t in moved.parked} == {dead1, dead2, dead3}
    # the CLI job is first in the order: the hand-off passes it by for the live job; a tick leases it
    assert state(led, live) == ("leased", 1) and state(led, cli) == ("new", 1)
    assert {x.job_id for x in led.tick("h")} == {cli}
    assert led.audit() == []


def test_cli_jobs_keep_requeue_on_expiry(led, clock):
    lane(led, lease_seconds=10)
    cli = led.submit("s", 100, "h")
    led.tick("h")
    clock.t += 11
    moved = led.reap()
    assert moved.requeued == [cli] and state(led, cli) == ("new", 2)
    assert led.tick("h")[0].job_id == cli


def test_a_waiter_unseen_for_a_few_heartbeats_is_dropped_from_admission_at_once(led, clock):
    lane(led)
    led.heartbeat("old")
    old = led.submit("s", 50, "h", waiter="old")  # first in the order
    clock.t += GONE_SECONDS + 1
    new = led.submit("s", 100, "h", waiter="new")
    [lease] = led.tick("h")
    assert lease.job_id == new
    assert state(led, old) == ("parked", 1) and led.job(old)["reason"].startswith(WAITER_GONE)
    assert [t["job_id"] for t in led.tail("h")] == [old]
    # its waiter was only stalled: it comes back and requeues its job (the gate does this)
    led.heartbeat("old")
    led.requeue(old)
    led.settle(lease, 100)
    assert state(led, old) == ("leased", 1)


def test_one_ticker_per_lane_a_tick_that_finds_another_running_returns_at_once(ledger_url, monkeypatch):
    a, b = Ledger(ledger_url), Ledger(ledger_url)  # two ledgers: as two processes (own locks, connections)
    lane(a, max_leased=5)
    for _ in range(3):
        a.submit("s", 100, "h", waiter="w")
    inside, release = threading.Event(), threading.Event()
    real = admission.tick

    def slow_tick(cur, lane_name, **kw):
        out = real(cur, lane_name, **kw)
        if threading.current_thread().name == "slow-ticker":
            inside.set()
            release.wait(10)
        return out

    monkeypatch.setattr(admission, "tick", slow_tick)
    got = {}
    t = threading.Thread(target=lambda: got.setdefault("a", a.try_tick("h")), name="slow-ticker")
    t.start()
    assert inside.wait(10)
    t0 = time.monotonic()
    same_process = a.try_tick("h")  # another thread of the same process
    other_process = b.try_tick("h")  # another connection: pg_try_advisory_xact_lock / BEGIN IMMEDIATE
    took = time.monotonic() - t0
    release.set()
    t.join()
    assert same_process == ([], True) and other_process == ([], True)
    assert took < 1.0, f"the busy ticks waited {took:.2f}s"
    assert len(got["a"][0]) == 3 and got["a"][1] is False
    assert b.db.stats.busy >= 1
    assert a.audit() == []
    a.close()
    b.close()


@pytest.mark.parametrize("by", ["same ledger", "another ledger"])
def test_a_waiter_wakes_when_its_job_is_handed_a_lease(ledger_url, monkeypatch, by):
    """In-process signal (the same ledger); LISTEN/NOTIFY on PostgreSQL or the own-row read on SQLite
    (another ledger: its own connections, as another process). No safety poll: it is set to 60 s."""
    monkeypatch.setattr(wakeups, "SAFETY_SECONDS", 60.0)
    a = Ledger(ledger_url)
    b = a if by == "same ledger" else Ledger(ledger_url)
    lane(a)
    first = a.submit("s", 100, "h", waiter="w")
    waiting = a.submit("s", 100, "h", waiter="w")
    [lease] = b.tick("h")
    assert lease.job_id == first
    w = a.wakeups.register(waiting, "h")
    time.sleep(0.3)  # the watcher is listening / polling
    assert not w.event.is_set()
    writes = a.db.stats.writes
    time.sleep(1.5)
    assert a.db.stats.writes - writes <= 3  # waiting costs heartbeats only: no ticks (safety poll off)
    b.settle(lease, 100)  # hands the room to `waiting`
    if b is a:
        assert w.event.is_set(), "the same ledger's commit sets the event before settle() returns"
    t0 = time.monotonic()
    assert w.event.wait(5.0), "the waiter was not woken"
    latency = time.monotonic() - t0
    assert latency < 0.6, f"woken {latency:.3f}s after the settlement"
    lease2 = a.take(w.row) if w.row is not None else a.acquire(waiting)
    assert lease2.job_id == waiting
    a.wakeups.unregister(waiting)
    a.settle(lease2, 100)
    assert a.audit() == []
    for x in {a, b}:
        x.close()


def test_a_rerun_of_a_job_parked_waiter_gone_is_its_next_attempt_under_the_new_waiter(led, clock):
    """Found by the Dask fault test at full count: a killed worker's waiter is gone, its waiting job is
    parked ``waiter gone``; Dask runs the task again elsewhere (same key, same attempt, ``rerun``). Before
    the fix the job stayed tied to the dead waiter: every tick parked it again and the rerun waited for ever."""
    lane(led, max_leased=1)
    blocker = led.submit("s", 100, "h", waiter="alive")
    clock.t += 1  # first in the order
    led.heartbeat("dead")
    job = led.submit("s", 100, "h", key="task-run-9", attempt=1, waiter="dead", rerun=True)
    assert [x.job_id for x in led.tick("h")] == [blocker]
    clock.t += GONE_SECONDS + 1
    led.heartbeat("alive")
    led.settle(blocker, 100)  # the hand-off finds the next job's waiter gone: parked
    assert state(led, job) == ("parked", 1) and led.job(job)["reason"].startswith(WAITER_GONE)
    led.heartbeat("rerun")
    again = led.submit("s", 100, "h", key="task-run-9", attempt=1, waiter="rerun", rerun=True)
    assert again == job and state(led, job) == ("new", 2) and led.job(job)["waiter"] == "rerun"
    assert [x.job_id for x in led.tick("h")] == [job]
    assert led.audit() == []


def test_a_settlement_takes_the_lane_lock_once_one_lock_wait_and_one_hold_sample(led):
    # The benchmark's lane-lock wait: one sample per transaction (the hand-off reuses the settlement's
    # locked row; a re-lock could not wait and would only dilute the percentiles).
    lane(led)
    led.submit("s", 100, "h", waiter="w1")
    led.submit("s", 100, "h", waiter="w1")
    [lease] = led.tick("h")
    waits, holds = len(led.db.stats.lock_waits), len(led.db.stats.lock_holds)
    led.settle(lease, 100)
    assert (len(led.db.stats.lock_waits) - waits, len(led.db.stats.lock_holds) - holds) == (1, 1)
    assert led.lane("h").leased == 1 and led.audit() == []


def test_a_settlement_after_a_period_boundary_counts_in_the_new_period_and_hands_its_room_on(led, clock):
    clock.t = 1_800_057_600.0 - 5  # five seconds before a UTC midnight
    lane(led, period="daily")
    a = led.submit("s", 100, "h", waiter="w1")
    clock.t += 1
    b = led.submit("s", 100, "h", waiter="w1")
    [lease] = led.tick("h")
    assert lease.job_id == a
    led.settle(lease, 70)  # hands its room to b
    assert led.lane("h").spent == 70
    lb = led.job(b)
    assert lb["state"] == "leased"
    clock.t += 10  # the next day; no tick in between: the settlement itself rolls the period first
    led.settle(b, 40, attempt=lb["attempt"])
    row = led.lane("h")
    assert (row.spent, row.reserved, row.leased) == (40, 0, 0)
    assert led.job(a)["state"] == "done" and led.audit() == []
