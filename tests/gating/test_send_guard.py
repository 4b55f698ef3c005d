"""The send guard (issue 24: "every 429 pauses every worker: requests sent into a closed window = 0"): a 429 a
gated body meets pauses its lane at httpx, before the SDK raises it, and a request another gated body sends
while the lane is paused is held until the reopen, even when its lease was granted before the 429. Real openai
SDK over HTTP against the emulator; gates outside a Prefect run (no server)."""

from __future__ import annotations

import threading
import time

import openai
import pytest

from lane_plugin import gate
from lane_plugin.testing import ProviderEmulator

pytestmark = pytest.mark.timeout(120)
WINDOW = 3.0


def _msgs(n: int) -> list[dict]:
    return [{"role": "user", "content": "word" * n}]


def _a_429_then_another_workers_send(ledger, emu) -> dict:
    """Thread B is admitted and in its body first; thread A then meets a 429 (the key's tokens spent outside the
    lane); only then does B send. What each saw, with times (time.time())."""
    client = openai.OpenAI(base_url=emu.base_url, api_key="k", max_retries=0)
    b_in_body, a_done = threading.Event(), threading.Event()
    seen: dict = {}

    def a() -> None:
        b_in_body.wait(10)
        assert emu.spend_outside(1_000)  # another client on the key spends the whole tokens window
        with pytest.raises(openai.RateLimitError) as err, gate(stage="a", estimate=60, lane="g", ledger=ledger):
            client.chat.completions.create(model="m", max_tokens=10, messages=_msgs(40))
        seen["a_raised"] = time.time()
        seen["a_retry_after_ms"] = int(err.value.response.headers["retry-after-ms"])
        a_done.set()

    def b() -> None:
        with gate(stage="b", estimate=60, lane="g", ledger=ledger) as g:
            b_in_body.set()
            a_done.wait(10)
            seen["b_called"] = time.time()
            try:
                g.report(client.chat.completions.create(model="m", max_tokens=10, messages=_msgs(40)))
                seen["b"] = "ok"
            except openai.RateLimitError:
                seen["b"] = "429"
            seen["b_returned"] = time.time()

    threads = [threading.Thread(target=b), threading.Thread(target=a)]
    [t.start() for t in threads]
    [t.join(60) for t in threads]
    seen["records"], seen["stats"] = emu.records, emu.stats()
    seen["offset"] = time.time() - emu.clock() + emu.t0  # time.time() less the emulator's seconds since its start
    return seen


def test_after_a_429_in_one_thread_another_threads_send_is_held_until_the_reopen(ledger):
    ledger.set_lane("g", allowance=10**6, ceiling=10**6, max_leased=10)
    with ProviderEmulator(tpm=1_000, rpm=None, window_seconds=WINDOW, output_lengths=[5]) as emu:
        seen = _a_429_then_another_workers_send(ledger, emu)
    recs = seen["records"]
    assert recs[0].status == 429 and seen["a_raised"] < seen["b_called"]  # A's 429 came first, B called after it
    reset = recs[0].t + seen["a_retry_after_ms"] / 1000  # when the emulator's window had room again
    assert seen["b"] == "ok" and len(recs) == 2 and recs[1].status == 200
    assert recs[1].t >= reset  # B's request reached the provider only after the 429's reset ...
    called = seen["b_called"] - seen["offset"]  # on the emulator's clock
    assert recs[1].t - called > 0.5  # ... though B's body made its call well before: held at the send
    assert seen["stats"]["sent_into_closed"] == 0 and seen["stats"]["sent_after_answer"] == 0
    job = ledger.rows("select rate_limited from job where stage = 'a'")[1]
    assert job == [(1,)]  # the pause was written once (by the guard), not again when the SDK's error ended A


def test_with_the_guard_off_the_other_threads_send_goes_into_the_closed_window(ledger, monkeypatch):
    # The switch (LANE_SEND_GUARD=false), and what the guard prevents: B, admitted before A's 429, sends into it.
    monkeypatch.setenv("LANE_SEND_GUARD", "false")
    ledger.set_lane("g", allowance=10**6, ceiling=10**6, max_leased=10)
    with ProviderEmulator(tpm=1_000, rpm=None, window_seconds=WINDOW, output_lengths=[5]) as emu:
        seen = _a_429_then_another_workers_send(ledger, emu)
    recs = seen["records"]
    assert recs[0].status == 429 and seen["a_raised"] < seen["b_called"]
    assert seen["b"] == "429" and [r.status for r in recs] == [429, 429]
    assert seen["stats"]["sent_into_closed"] == 1  # sent after A's answer was out, into the window it closed


def test_the_sdks_own_retry_after_a_429_is_held_by_the_guard_and_the_lane_is_paused_before_it(ledger, caplog):
    # With the SDK's retries on, no error reaches the gate: the guard alone pauses the lane for every worker,
    # and the SDK's retry waits for the reopen instead of failing.
    ledger.set_lane("r", allowance=10**6, ceiling=10**6, max_leased=10)
    with ProviderEmulator(tpm=1_000, rpm=None, window_seconds=WINDOW, output_lengths=[5]) as emu:
        client = openai.OpenAI(base_url=emu.base_url, api_key="k", max_retries=2)
        with gate(stage="s", estimate=60, lane="r", ledger=ledger) as g:
            assert emu.spend_outside(1_000)  # another client on the key spends the whole tokens window
            g.report(client.chat.completions.create(model="m", max_tokens=10, messages=_msgs(40)))
        recs = emu.records
    assert [r.status for r in recs] == [429, 200]  # the 429 happened, and the SDK's retry went through
    # the lane was paused for every worker though no error reached the gate (the guard heard the 429), and the
    # retry reopened it (the probe after the pause)
    assert ledger.rows("select rate_limited from job")[1] == [(1,)]
    lane = {s["lane"]: s for s in ledger.lanes()}["r"]
    assert lane["paused_until"] is None
    said = [r.getMessage() for r in caplog.records if "met the provider's rate limit (HTTP 429" in r.getMessage()]
    assert len(said) == 1 and "lane r paused" in said[0]  # paused by the guard, from the response's headers


def test_a_request_sent_late_in_the_body_has_its_charges_counted_from_its_send(ledger):
    # The lane dates a charge at the lease's pick-up plus the send slack (0.5 s); a request that leaves later
    # (a loaded machine, a body that works before it calls) would have the lane's window let its charge go
    # before the provider's window does.
    ledger.set_lane("late", allowance=10**6, ceiling=10**6, max_leased=10, burst_tokens=10**5, window_seconds=60.0)
    with ProviderEmulator(tpm=10**6, rpm=None, window_seconds=60.0, output_lengths=[5]) as emu:
        client = openai.OpenAI(base_url=emu.base_url, api_key="k", max_retries=0)
        with gate(stage="s", estimate=60, rate_cost=50, lane="late", ledger=ledger) as g:
            picked = time.time()
            time.sleep(0.8)  # past the send slack
            sent = time.time()
            g.report(client.chat.completions.create(model="m", max_tokens=10, messages=_msgs(40)))
        assert [r.status for r in emu.records] == [200]
    at = ledger._run(lambda cur, now: cur.scalar("select max(at) from rate_charge where job_id = :j", {"j": g.job_id}))
    assert sent - picked >= 0.8 and at >= sent  # counted from the send, not from the pick-up (picked + 0.5 s)
