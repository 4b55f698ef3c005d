"""The ledger's jitter never touches the global random module (it runs in the gate's background threads too)."""

from __future__ import annotations

import random
import sqlite3

from lane_plugin import Ledger
from lane_plugin.ledger import wait_and_acquire


def test_a_retried_transaction_leaves_the_global_random_state_alone(tmp_path):
    # A user's seeded sequence, or Hypothesis drawing in the main thread (which took it for "random inside
    # strategies"), must not move because a watcher thread retried a busy database.
    led = Ledger(f"sqlite:///{tmp_path / 'lane.db'}")
    calls = []

    def busy_once(cur):
        calls.append(1)
        if len(calls) == 1:
            raise sqlite3.OperationalError("database is locked")
        return 7

    led.upgrade()
    before = random.getstate()
    assert led.db.transaction(busy_once) == 7 and len(calls) == 2  # retried once, after a jittered sleep
    assert random.getstate() == before
    led.close()


def test_waiting_for_a_lease_with_backoff_leaves_the_global_random_state_alone(tmp_path):
    led = Ledger(f"sqlite:///{tmp_path / 'lane.db'}")
    led.set_lane("t", ceiling=100, allowance=100, burst_tokens=100)
    led.submit("s", 100, "t")
    [lease] = led.tick("t")  # the lane is full: the next job waits
    job = led.submit("s", 50, "t")
    before = random.getstate()
    assert wait_and_acquire(led, job, timeout=0.05, poll=0.01) is None  # polled several times, with jitter
    assert random.getstate() == before
    led.settle(lease, 100)
    led.close()
