"""What `lane status ID` says of an expired lease, and hostile text that reached
a traceback (a ledger URL or an estimator name holding a lone surrogate, as a non-UTF-8 byte on a command line
arrives). On both databases where a ledger is involved (``ledger_url``)."""

from __future__ import annotations

import pytest

from lane_plugin import Ledger
from lane_plugin.cli_text import job_lines
from lane_plugin.errors import InvalidInput


def lane(led, **kw):
    settings = dict(
        allowance=100_000,
        ceiling=100_000,
        start_fraction=1.0,
        burst_tokens=100_000,
        max_leased=5,
        lease_seconds=30,
        max_attempts=3,
        max_wait_seconds=600,
    )
    settings.update(kw)
    return led.set_lane("h", **settings)


def test_an_expired_lease_is_not_said_to_be_taken_back_by_a_tick(led, clock):
    # 'the next reap or tick takes it back': a tick reaps nothing (only `lane reap`, or a waiting gate's periodic
    # check, does), so an operator who ticks and looks again still sees the job leased.
    lane(led)
    job = led.submit("s", 100, "h")
    [lease] = led.tick("h")
    clock.t += 31
    led.tick("h")  # an explicit tick, as the message says
    s = led.wait_status(job)
    assert s["state"] == "leased" and s["lease_expired"]  # the tick did not take it back
    [line] = job_lines(s)
    assert "tick takes it back" not in line, line
    assert "lane reap" in line, line
    led.reap()
    assert led.job(job)["state"] == "new" and led.job(job)["attempt"] == 2


def test_an_expired_gated_lease_is_said_to_be_parked_not_requeued(led, clock):
    # A gated job (a waiter waited for it) whose lease expired is parked by the reap (waiter gone), never sent
    # 'to the queue for another attempt' whatever attempts it has left.
    lane(led)
    job = led.submit("s", 100, "h", waiter="w1")
    [lease] = led.tick("h")
    assert lease.job_id == job
    clock.t += 31
    [line] = job_lines(led.wait_status(job))
    assert "to the queue for another attempt" not in line, line
    assert "parks it" in line and "waiter" in line, line
    led.reap()
    assert led.job(job)["state"] == "parked"  # as the corrected line says


def test_lease_expired_agrees_with_the_reap_at_the_very_end(led, clock):
    # the reap takes back a lease with lease_until < now; at lease_until == now it is still live
    lane(led)
    job = led.submit("s", 100, "h")
    [lease] = led.tick("h")
    clock.t = lease.lease_until
    s = led.wait_status(job)
    led.reap()
    assert led.job(job)["state"] == "leased"
    assert not s["lease_expired"], s


@pytest.mark.parametrize("url", ["sqlite:///\udcff.db", "sqlite:////tmp/\udcff/x.db"])
def test_a_ledger_url_that_is_not_text_is_invalid_input(url):
    # `lane lanes --db sqlite:///$'\xff'.db` printed a UnicodeEncodeError traceback (rendering the URL)
    with pytest.raises(InvalidInput, match="database URL"):
        Ledger(url)


def test_an_estimator_name_that_is_not_text_is_invalid_input(led):
    # `lane estimators show --estimator $'\xff'` and `... refit --estimator $'\xff'`: a driver traceback
    from lane_plugin.estimators.learned import refit

    with pytest.raises(InvalidInput, match="estimator"):
        led.estimator_state("x\udcffy")
    with pytest.raises(InvalidInput, match="estimator"):
        refit(led, estimator="x\udcffy")
    with pytest.raises(InvalidInput, match="estimator"):
        led.estimator_state("x\x00y")


def test_a_long_preflight_url_is_still_accepted(led):
    # 05fefab checked preflight as text() with its 200-character default: a signed health URL that was
    # accepted before (and may already be set on a lane) was refused when set again
    url = "https://health.example.com/v1/ready?sig=" + "a" * 300
    assert led.set_lane("free", preflight=url).preflight == url
    with pytest.raises(InvalidInput, match="preflight"):
        led.set_lane("free", preflight="https://health.example.com/\udcff")


@pytest.mark.parametrize("home", ["p%41", "what?x", "a b"])
def test_the_default_ledger_lives_in_prefect_home_whatever_its_name(home, tmp_path, monkeypatch):
    # default_url() pasted PREFECT_HOME into the URL raw: 'p%41' decoded to 'pA', 'what?x' was cut at '?',
    # so the default ledger (and the home 7e17e9c creates for it) landed in another directory
    from lane_plugin.ledger.url import default_url, parse_url

    monkeypatch.setenv("PREFECT_HOME", str(tmp_path / home))
    assert parse_url(default_url()).path == str(tmp_path / home / "lane.db")
