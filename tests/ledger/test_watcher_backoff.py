"""The waiters' watcher waits out a database that is away with a growing pause and one warning per distinct
error (an outside review: it warned and retried every 0.2 s for as long as the database was gone)."""

from __future__ import annotations

import logging
import threading
import time
from types import SimpleNamespace

from lane_plugin.ledger import wakeups
from lane_plugin.ledger.waiters import waiter_id


def test_a_database_away_is_retried_with_backoff_and_said_once(led, monkeypatch, caplog):
    # Only this ledger's watcher's pauses are counted: the module's `time` is every watcher's of the process, and
    # one an earlier test left behind (its database gone) sleeps through it too (CI: 2.0 s pauses recorded first)
    slept: list[float] = []
    ours: set[int] = set()

    def sleep(seconds: float) -> None:
        if threading.get_ident() in ours:
            slept.append(seconds)
        time.sleep(0.001)

    monkeypatch.setattr(wakeups, "time", SimpleNamespace(monotonic=time.monotonic, sleep=sleep))
    w = led.wakeups
    cycle, fails = w._cycle, [7]

    def away_then_back(*args):
        ours.add(threading.get_ident())  # this ledger's watcher (it alone runs this ledger's cycle)
        if fails[0]:
            fails[0] -= 1
            raise ConnectionError("the database is away")
        return cycle(*args)

    monkeypatch.setattr(w, "_cycle", away_then_back)
    job = led.submit("s", 10, "free", waiter=waiter_id())
    with caplog.at_level(logging.DEBUG, logger="lane_plugin.wakeups"):
        w.register(job, "free")
        deadline = time.monotonic() + 20
        while not any("answers again" in r.getMessage() for r in caplog.records) and time.monotonic() < deadline:
            time.sleep(0.01)
        w.unregister(job)
    assert fails[0] == 0, "the watcher did not meet the 7 failures"
    assert slept[:7] == [0.2, 0.4, 0.8, 1.6, 2.0, 2.0, 2.0]
    said = [r for r in caplog.records if "the database is away" in r.getMessage()]
    assert [r.levelno for r in said] == [logging.WARNING] + [logging.DEBUG] * 6
    assert any("answers again after 7 failed tries" in r.getMessage() for r in caplog.records)
