"""On SQLite the watcher reads its waiting jobs' rows on its poll's schedule, not at every early wake-up.

Two processes whose ticks keep meeting make the watcher retick every 20 ms (``RETICK_SECONDS``).
Each of those cycles used to read every waiting row as well: in the 80 x 1 s benchmark on SQLite the
reads went from 76 to 221 per process between runs, and transactions per job from 6 to 13, past the
issue's 10. The reads now come every ``POLL_SQLITE`` seconds whatever wakes the watcher between.
"""

from __future__ import annotations

import time

from lane_plugin import Ledger
from lane_plugin.ledger import wakeups


def test_reticks_do_not_multiply_the_watchers_reads(tmp_path, monkeypatch):
    led = Ledger(f"sqlite:///{tmp_path / 'poll.db'}")
    led.set_lane(
        "p", allowance=10**6, ceiling=10**6, start_fraction=1.0, burst_tokens=10**6, max_leased=1, lease_seconds=60
    )
    led.submit("s", 100, "p")
    assert len(led.tick("p")) == 1  # the one slot taken: the waiting job below stays waiting
    job = led.submit("s", 100, "p")
    reads, ticks = [], []
    real_rows, real_tick = led.waiting_rows, led.try_tick
    monkeypatch.setattr(led, "waiting_rows", lambda ids: reads.append(time.monotonic()) or real_rows(ids))
    monkeypatch.setattr(led, "try_tick", lambda lane, **kw: ticks.append(lane) or real_tick(lane, **kw))
    w = led.wakeups.register(job, "p")
    try:
        end = time.monotonic() + 1.5
        while time.monotonic() < end:
            led.wakeups.retick("p")  # what a tick that found another running asks for
            time.sleep(wakeups.RETICK_SECONDS / 2)
    finally:
        led.wakeups.unregister(job)
    assert not w.event.is_set()
    assert len(ticks) > 30, "the reticks must really have made the watcher cycle (each one ticks)"
    # 1.5 s of polling at POLL_SQLITE (0.1 s): 15 reads, the safety poll's among them; not one per retick
    assert len(reads) <= 1.5 / wakeups.POLL_SQLITE + 3, len(reads)
    gaps = [b - a for a, b in zip(reads, reads[1:])]
    assert sum(g < wakeups.POLL_SQLITE * 0.9 for g in gaps) <= 2, gaps  # only the safety poll's comes early
    led.close()
