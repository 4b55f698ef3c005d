"""Issue 11 item 5: a job blocked by the burst window is admitted when the window frees, not at the next poll.

Room that frees by the window sliding has no settlement to hand it on: the tick that leaves a job
blocked says when the window will have room (``rates.free_at``), and the waiters' watcher ticks the
lane then. And the send slack: a charge is counted from when the request may reach the provider.
On both databases (``ledger_url``).
"""

from __future__ import annotations

import pytest

from lane_plugin import InvalidInput, Ledger
from lane_plugin.gating.ledgers import get_ledger
from lane_plugin.ledger import wakeups
from lane_plugin.policy.window import window_expiry


def lane(led, **kw):
    settings = dict(
        allowance=10**6,
        ceiling=10**6,
        start_fraction=1.0,
        burst_tokens=1_000,
        window_seconds=10.0,
        max_leased=100,
        lease_seconds=60,
        max_wait_seconds=600,
    )
    settings.update(kw)
    return led.set_lane("r", **settings)


def charges(led) -> list[tuple[float, int]]:
    _, rows = led.rows("select at, cost from rate_charge where lane = 'r' order by at")
    return [(float(at), int(cost)) for at, cost in rows]


def test_a_tick_that_leaves_a_job_blocked_by_the_window_says_when_the_window_has_room_for_it(led, clock):
    """(Jobs without a waiter: on this injected clock a gated job's waiter would be gone after 5 s.)"""
    from lane_plugin.ledger import admission

    lane(led)
    t0 = clock.t
    led.submit("s", 400, "r")
    assert len(led.tick("r")) == 1
    clock.t += 3
    led.submit("s", 500, "r")
    assert len(led.tick("r")) == 1  # 900 of 1,000 in the window
    clock.t += 1
    led.submit("s", 300, "r")  # needs 200 freed: the first charge (400) leaving at t0 + 10

    def tick(cur):
        return admission.tick(cur, "r", now=clock.t, token="x")

    ticked = led.db.transaction(tick)
    assert ticked.leases == [] and ticked.decision.head_reason == "burst"
    assert ticked.retry_in == pytest.approx(window_expiry(t0, 10.0) - clock.t)  # 6 s: at t0 + 10, not t0 + 13
    clock.t = window_expiry(t0, 10.0)
    assert [x.est for x in led.tick("r")] == [300]  # the instant the window slid, it fits
    led.submit("s", 600, "r")  # needs 400 more: the 500 charged at t0 + 3 must leave
    ticked = led.db.transaction(tick)
    assert ticked.retry_in == pytest.approx(window_expiry(t0 + 3, 10.0) - clock.t)
    assert led.audit() == []


def test_no_timed_tick_when_nothing_waits_on_the_window(led, clock):
    from lane_plugin.ledger import admission

    lane(led, max_leased=1)
    led.submit("s", 100, "r")
    led.submit("s", 100, "r")
    assert len(led.tick("r")) == 1
    ticked = led.db.transaction(lambda cur: admission.tick(cur, "r", now=clock.t, token="x"))
    assert ticked.decision.head_reason == "lease_cap" and ticked.retry_in is None  # a settlement hands it on


def test_a_waiter_blocked_by_the_window_is_admitted_when_it_slides_not_at_the_safety_poll(ledger_url, monkeypatch):
    """Real clock: the window frees 1.5 s after the first charge; the safety poll alone would tick at
    2 s (every second from the watcher's start), the timed tick at 1.5 s."""
    monkeypatch.setattr(wakeups, "SAFETY_SECONDS", 1.0)
    a = Ledger(ledger_url)
    lane(a, burst_tokens=1_000, window_seconds=1.5)
    first = a.submit("s", 800, "r")  # held by the ticker: its request goes out at the grant (a charge
    [lease] = a.tick("r")  # handed to another process's waiter would hold its room until picked up: rates)
    assert lease.job_id == first
    charged_at = charges(a)[0][0]
    waiting = a.submit("s", 800, "r", waiter="w")
    w = a.wakeups.register(waiting, "r")
    leases, _ = a.try_tick("r")  # what the gate does first: it ticks, and is told when the window frees
    assert leases == []
    assert w.event.wait(5.0), "never admitted"
    late = a.job(waiting)["admitted_at"] - window_expiry(charged_at, 1.5)
    assert 0 <= late < 0.25, f"admitted {late:.3f}s after the window had room"
    a.wakeups.unregister(waiting)
    a.settle(lease, 800)
    a.settle(a.take(w.row) if w.row is not None else a.acquire(waiting), 800)
    assert a.audit() == []
    a.close()


def test_the_send_slack_places_every_charge_that_much_after_the_pick_up(led, clock, ledger_url):
    lane(led)
    slack = Ledger(ledger_url, clock=clock, send_slack=0.5)
    x = slack.submit("s", 100, "r")
    y = slack.submit("s", 200, "r")
    leases = slack.tick("r")  # one tick leases both; the ticker holds x
    assert {le.job_id for le in leases} == {x, y}
    assert charges(slack) == [(clock.t + 0.5, 100), (clock.t + 0.5, 200)]
    clock.t += 2  # y's waiter picks its lease up later: its request goes out from then
    slack.take(
        tuple(
            slack.job(y)[k]
            for k in (
                "id",
                "lane",
                "stage",
                "est",
                "attempt",
                "lease_token",
                "lease_until",
                "run_key",
                "rate_cost",
                "state",
                "reason",
                "admitted_at",
            )
        )
    )
    assert sorted(charges(slack)) == [(clock.t - 2 + 0.5, 100), (clock.t + 0.5, 200)]
    assert slack.lane("r").window_used == 300 and slack.audit() == []
    clock.t += 8.25  # 10.25 s after x's pick-up: without the slack its charge would have left the window
    assert slack.tick("r") == [] and slack.lane("r").window_used == 300
    clock.t += 0.25  # pick-up + slack + window
    slack.tick("r")
    assert slack.lane("r").window_used == 200
    slack.close()


@pytest.mark.parametrize("window, given, slack", [(1.0, None, 0.05), (60.0, None, 0.5), (1.0, 0.5, 0.5)])
def test_the_default_send_slack_is_at_most_a_twentieth_of_the_window_and_a_set_one_is_kept(
    led, clock, ledger_url, window, given, slack
):
    # On the 1 s default window a 0.5 s slack would hold every charge 1.5 s: a third of the burst lost.
    lane(led, window_seconds=window)
    gated = Ledger(ledger_url, clock=clock, send_slack=given)
    x = gated.submit("s", 100, "r")
    y = gated.submit("s", 200, "r")
    assert {le.job_id for le in gated.tick("r")} == {x, y}
    assert charges(gated) == [(clock.t + slack, 100), (clock.t + slack, 200)]
    clock.t += 2
    gated.take(
        tuple(
            gated.job(y)[k]
            for k in (
                "id",
                "lane",
                "stage",
                "est",
                "attempt",
                "lease_token",
                "lease_until",
                "run_key",
                "rate_cost",
                "state",
                "reason",
                "admitted_at",
            )
        )
    )
    assert (clock.t + slack, 200) in charges(gated)
    gated.close()


def test_the_gate_ledger_takes_its_send_slack_from_the_setting(tmp_path, monkeypatch):
    monkeypatch.setenv("LANE_SEND_SLACK_SECONDS", "0.125")
    assert get_ledger(f"sqlite:///{tmp_path / 'a.db'}").send_slack == 0.125
    monkeypatch.delenv("LANE_SEND_SLACK_SECONDS")
    assert get_ledger(f"sqlite:///{tmp_path / 'b.db'}").send_slack is None  # unset: 0.5 s, at most 5% of the window
    assert Ledger(f"sqlite:///{tmp_path / 'c.db'}").send_slack == 0.0
    with pytest.raises(InvalidInput, match="send_slack"):
        Ledger(f"sqlite:///{tmp_path / 'd.db'}", send_slack=-1)


@pytest.mark.parametrize(("send_slack", "window", "slack"), [(0.5, 10.0, 0.5), (None, 1.0, 0.05), (0.5, 1.0, 0.5)])
def test_the_watcher_stamps_the_charge_of_a_lease_another_process_handed_so_its_waiter_commits_nothing(
    pg_url, send_slack, window, slack
):
    """PostgreSQL: another process's tick leases the job; this process's watcher reads the row (as on a
    NOTIFY) and in the same statement moves the charge to its own read's time plus the slack (as
    ``take`` would have, the default slack at most 5% of the window): the woken waiter picks the lease
    up without a transaction of its own."""
    t0 = 1_000_000.0
    other = Ledger(pg_url, clock=lambda: t0, send_slack=send_slack)  # its own connections
    here = Ledger(pg_url, clock=lambda: t0 + 2.0, send_slack=send_slack)  # picks up 2 s after the grant
    lane(other, window_seconds=window)
    job = other.submit("s", 100, "r", waiter="w")
    [lease] = other.tick("r")
    assert lease.job_id == job and charges(other) == [(pytest.approx(t0 + slack, rel=0, abs=1e-6), 100)]
    w = here.wakeups.register(job, "r")  # its watcher's first look (on its listening connection) finds it leased
    assert w.event.wait(5.0), "the watcher never woke the waiter"
    assert w.sent and w.row[0] == job and w.row[9] == "leased"
    commits = here.db.stats.commits
    got = here.take(w.row, sent=True)
    assert got is not None and got.job_id == job and got.token == lease.token
    assert here.db.stats.commits == commits, "the pick-up ran a transaction"
    # later only: from the pick-up, plus the slack
    assert charges(other) == [(pytest.approx(t0 + 2.0 + slack, rel=0, abs=1e-6), 100)]
    _, [(sent,)] = other.rows("select sent from rate_charge")
    assert sent  # was pending (handed to w) until the watcher's read picked it up
    here.wakeups.unregister(job)
    here.settle(got, 100)
    assert here.audit() == []
    here.close()
    other.close()
