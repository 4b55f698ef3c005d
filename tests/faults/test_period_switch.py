"""Issue 10 item 4: ``lane lanes set L --period daily`` on a lane with spend wiped the current
period's spend: 900 spent, switch, 3 x 300 more admitted -> 1,800 settled today against a daily
ceiling of 1,000. Changing the period keeps what was spent in the current period (and only that).
"""

from __future__ import annotations

import calendar
import time

import pytest

from lane_plugin import Ledger

from .conftest import assert_audit_clean, figure, make_lane

NOON = float(calendar.timegm((2027, 3, 10, 12, 0, 0)))  # a Wednesday noon, UTC
DAY = 86_400.0


def _settled_today(led, now: float) -> tuple[int, int]:
    """Own SQL: (tokens settled since today's UTC midnight, estimates leased now) in lane free."""
    midnight = float(calendar.timegm(time.gmtime(now)[:3] + (0, 0, 0)))
    cols, rows = led.rows(
        "select (select coalesce(sum(actual), 0) from settlement where lane = 'free' and settled_at >= :m), "
        "(select coalesce(sum(est), 0) from job where lane = 'free' and state = 'leased')",
        {"m": midnight},
    )
    return rows[0][0], rows[0][1]


def _spend(led, n: int, est: int = 300) -> int:
    for _ in range(n):
        led.submit("s", est)
    leases = led.tick()
    for lease in leases:
        led.settle(lease, est)
    return len(leases)


@pytest.mark.parametrize("db", ["sqlite", "postgresql"])
def test_switching_to_a_daily_period_keeps_todays_spend(db, request, clock):
    url = request.getfixturevalue("sqlite_url" if db == "sqlite" else "pg_url")
    clock.t = NOON
    led = Ledger(url, clock=clock)
    make_lane(led, ceiling=1000)  # no period
    assert _spend(led, 3) == 3  # 900 spent today
    led.set_lane("free", period="daily")
    clock.t += 60
    admitted = _spend(led, 3)
    today, leased = _settled_today(led, clock.t)
    figure(
        f"period switch {db}: 900 settled, then --period daily: {admitted} of 3 x 300 admitted, {today} settled "
        f"today against the daily ceiling 1,000 (own SQL; before the fix: 3 admitted, 1,800)"
    )
    assert admitted == 0 and today + leased <= 1000
    assert led.lane("free").spent == 900
    assert_audit_clean(led)
    clock.t += DAY  # the next day starts from nothing
    assert _spend(led, 4) == 3 and led.lane("free").spent == 900
    assert_audit_clean(led)


@pytest.mark.parametrize("db", ["sqlite", "postgresql"])
def test_switching_period_counts_only_the_new_current_period(db, request, clock):
    url = request.getfixturevalue("sqlite_url" if db == "sqlite" else "pg_url")
    clock.t = NOON - DAY
    led = Ledger(url, clock=clock)
    make_lane(led, ceiling=2000)
    assert _spend(led, 3) == 3  # 900 spent yesterday
    clock.t = NOON
    led.set_lane("free", period="daily")
    assert led.lane("free").spent == 0  # yesterday's spend is not today's
    assert _spend(led, 1) == 1
    led.set_lane("free", period="monthly")  # this month: yesterday's 900 and today's 300
    assert led.lane("free").spent == 1200
    assert _spend(led, 3) == 2 and led.lane("free").spent == 1800
    led.set_lane("free", period="none")  # no reset after this: the month's spend stays
    clock.t += 40 * DAY
    assert _spend(led, 1) == 0 and led.lane("free").spent == 1800
    assert_audit_clean(led)
