"""``submit(wait_seconds=)`` is a span from now: a bad one says what a span must be, not "epoch seconds"."""

from __future__ import annotations

import pytest

from lane_plugin import InvalidInput


@pytest.mark.parametrize("wait", [float("inf"), float("nan"), -3.0, 1e13])
def test_a_bad_wait_is_refused_as_a_span(led, wait):
    # `lane submit --wait inf` said "invalid wait_seconds inf: expected epoch seconds".
    with pytest.raises(InvalidInput, match=r"wait_seconds .*expected a number at least 0 and at most 1e\+12") as exc:
        led.submit("s", 5, "free", wait_seconds=wait)
    assert "epoch" not in str(exc.value)


def test_a_wait_sets_the_deadline_from_now(led, clock):
    jid = led.submit("s", 5, "free", wait_seconds=30)
    assert led.job(jid)["deadline"] == pytest.approx(clock() + 30)
