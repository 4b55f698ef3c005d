"""Issue 27, item 3: a backward clock step no longer keeps a dead holder's lease (SQLite and PostgreSQL).

``lease_until`` is absolute on the ledger's clock. A ledger one day fast leased a job, its holder died,
the clock was corrected back: the lease then ran for a day and 90 s more. Reap moved nothing (at +0 s,
+91 s, +3,600 s), ``reserved`` kept its estimate, a 300-token job that fit was never admitted, and
``lane audit`` said nothing. Now a lease can never be further ahead than ``now + lease_seconds``: audit
names one that is, the reap pulls it back to that, and the dead lease is reaped ``lease_seconds`` later.

The holder is a separate process whose ledger clock reads a day fast (an injected clock: on PostgreSQL
the ledger's clock is the database server's, which a test cannot step); it is SIGKILLed, and the test's
ledger, on the corrected clock, is driven by hand (``tests/conftest.py`` ``Clock``).
"""

from __future__ import annotations

import signal
import time

from lane_plugin import Ledger
from lane_plugin.ledger.leases import SKEW_SECONDS

from .conftest import assert_audit_clean, make_lane, read_json_lines, spawn

DAY = 86_400.0
LEASE = 90.0


def _leased_by_a_holder_a_day_fast(url: str, job_id: str, at: float, tmp_path) -> dict:
    out = tmp_path / "holder.jsonl"
    holder = spawn("lease_at", url, job_id, at, out)
    try:
        deadline = time.monotonic() + 60
        while not read_json_lines(out):
            assert holder.poll() is None, f"the holder exited ({holder.returncode}) before leasing"
            assert time.monotonic() < deadline, "the holder never leased"
            time.sleep(0.05)
        [rec] = read_json_lines(out)
    finally:
        holder.send_signal(signal.SIGKILL)
    assert holder.wait(timeout=30) == -signal.SIGKILL  # the holder really died: nobody renews its lease
    return rec


def test_a_dead_holders_lease_from_a_clock_a_day_fast_is_reaped_within_lease_seconds(ledger_url, clock, tmp_path):
    led = Ledger(ledger_url, clock=clock)
    make_lane(led, "free", ceiling=1000, lease_seconds=LEASE)
    big = led.submit("big", 800, "free")
    rec = _leased_by_a_holder_a_day_fast(ledger_url, big, clock.t + DAY, tmp_path)
    small = led.submit("small", 300, "free")

    # the fault: on the corrected clock the dead lease ends a day and 90 s from now, and holds 800 tokens
    job = led.job(big)
    assert (job["state"], rec["attempt"]) == ("leased", 1)
    assert job["lease_until"] == rec["lease_until"] == clock.t + DAY + LEASE
    assert led.lane("free").reserved == 800 and led.tick("free") == []  # 300 more would pass the ceiling
    [said] = led.audit()
    assert f"lease of job {big} ends {DAY + LEASE:.0f}s from now" in said and "lease_seconds (90s)" in said, said
    assert led.lease_expired(), "a waiting process's watcher would not notice it (and so never reap)"

    first = led.reap()  # right after the correction: pulled back to now + lease_seconds, not taken yet
    assert (first.bounded, first.requeued, first.parked) == ([big], [], [])
    assert led.job(big)["lease_until"] == clock.t + LEASE
    assert not led.lease_expired() and led.audit() == []
    clock.t += LEASE - 1
    assert not led.reap(), "a lease reaped before lease_seconds passed since the correction"
    clock.t += 2  # lease_seconds (and a second) after the correction
    assert led.reap().requeued == [big]
    assert led.lane("free").reserved == 0
    assert [x.job_id for x in led.tick("free")] == [small]  # smallest first: the 300-token job fits now
    assert led.job(big)["state"] == "new" and led.job(big)["attempt"] == 2
    assert_audit_clean(led)
    led.close()


def test_a_live_holder_keeps_its_lease_through_a_step_back_and_a_shorter_lease_seconds(ledger_url, clock):
    led = Ledger(ledger_url, clock=clock)
    make_lane(led, "free", lease_seconds=LEASE)
    job = led.submit("s", 10, "free")
    [lease] = led.tick("free")
    clock.t -= 30  # a step back past the skew allowed between workers' readings
    assert led.lease_expired() and any(f"lease of job {job} ends" in line for line in led.audit())
    assert led.reap().bounded == [job] and led.job(job)["lease_until"] == clock.t + LEASE
    clock.t += LEASE / 3  # the holder renews on time: the bound took nothing from it
    until = led.renew(lease.job_id, lease.token)
    assert until == clock.t + LEASE and led.job(job)["state"] == "leased"
    clock.t -= SKEW_SECONDS / 2  # within the skew: nothing to say, nothing written
    assert not led.lease_expired() and led.reap().bounded == [] and led.audit() == []
    clock.t += SKEW_SECONDS / 2
    led.set_lane("free", lease_seconds=10.0)  # leases granted longer end as the new length allows
    assert led.job(job)["lease_until"] == clock.t + 10.0 and led.audit() == []
    assert led.settle(lease, 12).actual == 12
    assert_audit_clean(led)
    led.close()
