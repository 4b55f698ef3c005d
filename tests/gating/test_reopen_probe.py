"""The half-way reopen after a provider's pause, within one process (issue 24): one probe, the others held
until it returns, and a probe that hangs does not stall the lane. No Prefect server: the gate's mixin alone."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from lane_plugin import Ledger
from lane_plugin.gating import provider_pause
from lane_plugin.gating.provider_pause import PROBE_POLL, PROBE_POLL_LEDGER, ProviderPause


class _Gate(ProviderPause):
    ledger: Ledger | None = None  # the test's ledger: each gate's job is a real one (a 429 pauses through it)

    def __init__(self, i: int):
        job = self.ledger.submit("s", 1, "l", key=f"j{i}") if self.ledger is not None else f"j{i}"
        self.stage, self.lane, self.job_id = "s", "l", job
        self.lease = SimpleNamespace(lane="l", job_id=job, attempt=1)
        self._waited_pause = False


@pytest.fixture
def led(tmp_path):
    led = Ledger(f"sqlite:///{tmp_path / 'lane.db'}")
    led.set_lane("l", allowance=10**6, ceiling=10**6)
    _Gate.ledger = led
    yield led
    _Gate.ledger = None
    led.close()


def _reopen(led: Ledger) -> None:
    led.pause("l", 0.05, reason="a 429")
    while led.paused_for("l") > 0:
        time.sleep(0.01)


def test_one_probe_goes_and_its_success_opens_the_lane_to_the_others(led):
    g1, g2, g3 = _Gate(1), _Gate(2), _Gate(3)
    assert g1._paused_for(led) == 0.0  # open, never paused: everyone sends
    _reopen(led)
    assert g1._paused_for(led) == 0.0  # the probe
    assert g2._paused_for(led) == PROBE_POLL and g3._paused_for(led) == PROBE_POLL  # held behind it
    g1._probe_done(led, None)
    assert g2._paused_for(led) == 0.0 and g3._paused_for(led) == 0.0
    assert g2._probe is None and g3._probe is None  # open: no second probe


def test_a_probe_that_meets_a_429_keeps_the_lane_closed(led):
    g1, g2 = _Gate(1), _Gate(2)
    _reopen(led)
    assert g1._paused_for(led) == 0.0
    err = type("RateLimitError", (Exception,), {})()
    err.response = SimpleNamespace(status_code=429, headers={"retry-after": "5"})
    g1._heard_provider(led, err)  # as the gate's exit does with the probe's 429
    g1._probe_done(led, err)
    assert g2._paused_for(led) > 4.0  # the new pause, not an open lane


def test_a_probe_that_hangs_past_its_hold_opens_the_lane(led, monkeypatch):
    monkeypatch.setattr(provider_pause, "PROBE_HOLD", 0.05)
    g1, g2, g3 = _Gate(1), _Gate(2), _Gate(3)
    _reopen(led)
    assert g1._paused_for(led) == 0.0
    assert g2._paused_for(led) == PROBE_POLL
    time.sleep(0.06)
    assert g2._paused_for(led) == 0.0 and g3._paused_for(led) == 0.0  # no one waits on it any longer
    _reopen(led)  # and the next pause gets its own probe, not the hung one's claim
    assert g3._paused_for(led) == 0.0 and g3._probe is not None
    assert g2._paused_for(led) == PROBE_POLL


def test_the_probe_is_one_for_the_lane_across_ledgers_as_across_processes(led, tmp_path):
    other = Ledger(f"sqlite:///{tmp_path / 'lane.db'}")  # another process's ledger: its own memory and probes
    try:
        g1, g2, g3 = _Gate(1), _Gate(2), _Gate(3)
        _reopen(led)  # paused and ended in led's process; `other` saw none of it
        assert other.paused_here("l") == 0.0 and other.pause_state("l")[1] is not None  # ended, not reopened
        assert g2._paused_for(other) == 0.0 and g2._probe is not None  # the first gate anywhere probes
        assert 0 < g1._paused_for(led) <= PROBE_POLL_LEDGER and g1._probe is None  # the ledger says: one is out
        assert 0 < g3._paused_for(other) <= PROBE_POLL  # behind its own process's probe, no claim of its own
        g2._probe_done(other, None)
        assert led.pause_state("l") == (0.0, None, None)  # open for every process
        assert g1._paused_for(led) == 0.0 and g3._paused_for(other) == 0.0 and g1._probe is None
    finally:
        other.close()


def test_a_probe_whose_gate_never_sent_is_given_back_to_the_next_gate(led):
    g1, g2 = _Gate(1), _Gate(2)
    _reopen(led)
    assert g1._paused_for(led) == 0.0 and led.pause_state("l")[2] is not None  # claimed in the ledger
    g1._drop_probe(led)  # stopped (a timeout) before its body ran
    assert led.pause_state("l")[2] is None and led.pause_state("l")[1] is not None  # not reopened: given back
    assert g2._paused_for(led) == 0.0 and g2._probe is not None  # the next gate is the probe
