"""Ledger.wait_status: the numbers a waiting gate logs (no Prefect needed)."""

from __future__ import annotations

from lane_plugin import Ledger


def test_position_follows_the_priority_and_reports_the_blocking_rule(tmp_path):
    clock = [1000.0]
    led = Ledger(f"sqlite:///{tmp_path / 'l.db'}", clock=lambda: clock[0])
    led.set_lane("tiny", ceiling=1000, allowance=1000, start_fraction=1.0, burst_tokens=1000, max_wait_seconds=60)
    hog = led.submit("s", 900, "tiny")
    assert [lease.job_id for lease in led.tick("tiny")] == [hog]
    big = led.submit("s", 500, "tiny")
    clock[0] += 1
    small = led.submit("s", 200, "tiny")
    clock[0] += 1
    mid = led.submit("s", 300, "tiny")
    st = {j: led.wait_status(j) for j in (big, small, mid, hog)}
    assert [st[j]["position"] for j in (small, mid, big)] == [1, 2, 3]
    assert st[hog]["position"] == 0 and st[hog]["state"] == "leased"
    assert st[big]["waiting"] == 3 and st[big]["remaining"] == 100 and st[big]["blocked_by"] == "ceiling"
    assert st[big]["reason"] is None  # it fits once the leased hog settles: it waits
    assert (st[big]["spent"], st[big]["reserved"], st[big]["leased"]) == (0, 900, 1)
    # A token of size is worth 60 s / 1000 = 0.06 s of waiting: big ranks as if it arrived 30 s later.
    # Nothing arriving after that passes it, however small.
    clock[0] += 30
    tiny = led.submit("s", 1, "tiny")
    assert led.wait_status(tiny)["position"] == 4 and led.wait_status(big)["position"] == 3
    led.settle(hog, 100)
    assert led.wait_status(small)["blocked_by"] is None
    led.set_lane("tiny", stopped=True)
    assert led.wait_status(small)["blocked_by"] == "stopped"
    assert led.audit() == []


def test_a_run_already_started_is_not_start_limited(tmp_path):
    led = Ledger(f"sqlite:///{tmp_path / 'l.db'}")
    led.set_lane("t", ceiling=1000, allowance=1000, start_fraction=0.5, burst_tokens=1000)
    first = led.submit("a", 450, "t", run_key="run-1")
    led.tick("t")
    led.settle(first, 450)
    later = led.submit("b", 100, "t", run_key="run-1")
    new = led.submit("a", 100, "t", run_key="run-2")
    assert led.wait_status(later)["starts_run"] is False and led.wait_status(later)["blocked_by"] is None
    assert led.wait_status(new)["starts_run"] is True and led.wait_status(new)["blocked_by"] == "start_limit"


def test_the_wait_line_reads_the_status_only_when_info_is_logged(tmp_path, caplog):
    """A thousand waiters that started together log at the same moments: with INFO off nothing is read."""
    import logging

    from lane_plugin.gating import tokenlog

    led = Ledger(f"sqlite:///{tmp_path / 'l.db'}")
    led.set_lane("tiny", ceiling=1000, allowance=1000, start_fraction=1.0, burst_tokens=1000, max_leased=1)
    led.submit("s", 900, "tiny")
    led.tick("tiny")
    job = led.submit("s", 500, "tiny")
    logger = logging.getLogger("lane_plugin.test_wait_line")
    reads = led.db.stats.commits
    logger.setLevel(logging.WARNING)
    tokenlog.waiting(logger, led, stage="s", job_id=job, waited=1.0)
    assert led.db.stats.commits == reads, "wait_status was read for a line nobody sees"
    logger.setLevel(logging.INFO)
    with caplog.at_level(logging.INFO, logger=logger.name):
        tokenlog.waiting(logger, led, stage="s", job_id=job, waited=1.0)
    assert led.db.stats.commits > reads
    assert "s job waiting 1.0s in lane 'tiny'" in caplog.text and "position 1 of 1 waiting" in caplog.text
    assert "blocked by lease_cap" in caplog.text or "blocked by ceiling" in caplog.text
    led.close()
