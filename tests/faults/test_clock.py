"""Item 9: one clock per ledger. On PostgreSQL leases and windows use the database's clock, so
workers whose own clocks are 300 s off neither expire leases early nor keep them late."""

from __future__ import annotations

import time

import pytest

from lane_plugin import Ledger

from .conftest import assert_audit_clean, figure, make_lane, read_json_lines, spawn, wait_all

SKEW = 300.0
LEASE = 15.0  # long enough that the "early" reap below is early even on a loaded machine (it proves it was)


def _run(mode, tmp_path, name, *args):
    out = tmp_path / f"{name}.jsonl"
    assert wait_all([spawn(mode, *args, out)], timeout=120) == [0]
    [rec] = read_json_lines(out)
    return rec


@pytest.mark.postgres
def test_skewed_workers_use_the_database_clock(pg_url, tmp_path):
    led = Ledger(pg_url)
    make_lane(led, "free", lease_seconds=LEASE, window_seconds=60.0, burst_tokens=10_000)
    a, b = led.submit("ahead", 10, "free"), led.submit("behind", 10, "free")
    ahead = _run("skew", tmp_path, "ahead", pg_url, a, +SKEW)  # acquires one job, then reaps
    db_now = led.now()
    assert abs(ahead["worker_now"] - ahead["ledger_now"] - SKEW) < 5, "the worker's clock was not skewed"
    assert abs(ahead["ledger_now"] - db_now) < 5, "the ledger read the worker's clock, not the database's"
    assert abs(ahead["lease_until"] - (ahead["ledger_now"] + LEASE)) < LEASE, ahead
    assert ahead["reaped"] == [], "a worker 300 s ahead expired a live lease early"
    # the worker's acquire leased its own job only (b is another's to pull); the test's tick leases b
    assert led.job(a)["state"] == "leased" and led.job(b)["state"] == "new"
    assert [x.job_id for x in led.tick("free")] == [b]
    leased = {j: led.job(j) for j in (a, b)}
    behind = _run("reap_only", tmp_path, "behind-early", pg_url, -SKEW)
    first_end = min(leased[a]["lease_until"], leased[b]["lease_until"])
    assert behind["ledger_now"] < first_end, "the early reap ran after a lease ended (machine too slow for LEASE)"
    assert behind["reaped"] == [], "a worker 300 s behind expired a live lease early"
    _, [(charged_at,)] = led.rows("select max(at) from rate_charge where lane = 'free'")
    assert abs(charged_at - db_now) <= 61, f"rate window charge at {charged_at} is not on the database clock {db_now}"
    until = max(leased[a]["lease_until"], leased[b]["lease_until"])
    while led.now() <= until + 0.2:
        time.sleep(0.1)
    late = _run("reap_only", tmp_path, "behind-late", pg_url, -SKEW)
    assert sorted(late["reaped"]) == sorted([a, b]), "a worker 300 s behind kept expired leases"
    assert_audit_clean(led)
    figure(
        f"clock pg: workers {SKEW:+.0f}s and {-SKEW:+.0f}s off: lease_until = database now + {LEASE:g}s "
        f"(off by {abs(ahead['lease_until'] - ahead['ledger_now'] - LEASE):.2f}s), no early reap at +{SKEW:.0f}s, "
        f"both leases reaped on time at -{SKEW:.0f}s; burst window on the database clock"
    )


def test_injected_clock_drives_expiry(sqlite_url):
    """Ledger(url, clock=...) is the one clock of that ledger: expiry follows it, not the machine's."""
    t = [1_000_000.0]
    led = Ledger(sqlite_url, clock=lambda: t[0])
    make_lane(led, "free", lease_seconds=10.0)
    job = led.submit("s", 5, "free")
    [lease] = led.tick("free")
    assert lease.lease_until == t[0] + 10
    t[0] += 9.9
    assert led.reap().requeued == []
    t[0] += 0.2
    assert led.reap().requeued == [job]
    assert_audit_clean(led)


def test_a_worker_slightly_behind_cannot_reopen_a_burst_window(sqlite_url):
    """Regression: a tick whose clock read a little earlier (another process, or a clock read before
    a lock wait) moved the burst window *back* and zeroed its usage, so the burst was admitted twice."""
    t = [1000.2]
    ahead = Ledger(sqlite_url, clock=lambda: t[0])
    behind = Ledger(sqlite_url, clock=lambda: t[0] - 0.5)
    make_lane(ahead, "free", burst_tokens=10, window_seconds=1.0)
    for _ in range(3):
        ahead.submit("s", 10, "free")
    assert len(ahead.tick("free")) == 1
    assert behind.tick("free") == []  # still window 1000 for the ledger: the burst is used
    assert ahead.tick("free") == []
    t[0] += 1.0
    assert len(ahead.tick("free")) == 1  # the next window opens on time
    assert_audit_clean(ahead)
