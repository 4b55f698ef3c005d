"""The provider's word wins (issue 24): a 429 met in a gated body closes the lane for every worker until
the provider's reset, the attempt bills nothing, and Prefect's retry comes after the pause. Real openai SDK
over HTTP against the emulator."""

from __future__ import annotations

import time

import httpx
import openai
import pytest
from prefect import flow

from lane_plugin import gate, lane_task, track_limits
from lane_plugin.gating.ratelimits import rate_limit_info
from lane_plugin.testing import ProviderEmulator

pytestmark = [pytest.mark.usefixtures("prefect_server"), pytest.mark.timeout(180)]


def _msgs(n: int) -> list[dict]:
    return [{"role": "user", "content": "word" * n}]


def test_the_providers_errors_are_recognised_with_their_reset_without_importing_an_sdk():
    req = httpx.Request("POST", "http://x/v1/chat/completions")
    resp = httpx.Response(
        429,
        headers={
            "x-ratelimit-reset-requests": "6m0s",
            "x-ratelimit-remaining-requests": "0",
            "x-ratelimit-reset-tokens": "20ms",
            "retry-after": "1",
        },
        request=req,
    )
    said = rate_limit_info(httpx.HTTPStatusError("429", request=req, response=resp))
    assert said is not None and said.seconds == 360.0 and said.source == "x-ratelimit-reset-requests"
    rl = openai.RateLimitError(
        "slow down", response=httpx.Response(429, headers={"retry-after-ms": "1500"}, request=req), body=None
    )
    assert rate_limit_info(rl).seconds == 1.5
    future = "2099-01-01T00:00:00Z"
    anth = httpx.Response(
        429,
        headers={
            "anthropic-ratelimit-output-tokens-remaining": "0",
            "anthropic-ratelimit-output-tokens-reset": future,
            "anthropic-ratelimit-requests-reset": "2000-01-01T00:00:00Z",
        },
        request=req,
    )
    said = rate_limit_info(httpx.HTTPStatusError("429", request=req, response=anth), now=4_070_908_790.0)
    assert said.source == "anthropic-ratelimit-output-tokens-reset" and said.seconds == pytest.approx(10.0)
    assert rate_limit_info(httpx.HTTPStatusError("500", request=req, response=httpx.Response(500, request=req))) is None
    assert rate_limit_info(ValueError("no")) is None


def test_a_429_in_a_gated_body_pauses_the_lane_bills_nothing_and_the_retry_waits_for_the_reopen(ledger):
    ledger.set_lane("p", allowance=10**6, ceiling=10**6, burst_tokens=10**5, window_seconds=2.0, max_leased=10)
    with ProviderEmulator(tpm=10**6, rpm=1, window_seconds=2.0, output_lengths=[5]) as emu:
        client = openai.OpenAI(base_url=emu.base_url, api_key="k", max_retries=0)

        @lane_task(stage="ask", estimate=60, lane="p", retries=1, retry_delay_seconds=0)
        def ask(i: int):
            return client.chat.completions.create(model="m", max_tokens=10, messages=_msgs(40 + i))

        @flow
        def two():
            return [ask.submit(i) for i in range(2)]

        futures = two()
        [f.result() for f in futures] if isinstance(futures, list) else None
        recs = emu.records
        stats = emu.stats()
    rejected = [r for r in recs if r.status == 429]
    assert len(rejected) == 1  # one met the request limit; the pause kept the other from sending into it
    # requests that arrived while the 429 still said to wait (until the reset it named: the first request
    # leaving the 2 s window), as the emulator counts them
    sent_in_closed = stats["sent_into_closed"]
    lane = {s["lane"]: s for s in ledger.lanes()}["p"]
    rows = {r["rate_limited"]: r for r in (ledger.job(j[0]) for j in ledger.rows("select id from job")[1])}
    assert 1 in rows and rows[1]["actual"] > 0  # the retry that succeeded billed; the 429 attempt billed 0
    settled = ledger.rows(
        "select actual, outcome from settlement where job_id = :j order by attempt", {"j": rows[1]["id"]}
    )[1]
    assert settled[0] == (0, "failed") and settled[1][1] == "done"
    assert sent_in_closed == 0 and len([r for r in recs if r.status == 200]) == 2
    assert lane["paused_until"] is None  # reopened


def test_track_limits_trues_the_window_up_to_the_providers_count_and_pauses_on_a_429(ledger):
    ledger.set_lane(
        "t", allowance=10**6, ceiling=10**6, burst_tokens=10**5, window_seconds=60.0, limits=["requests=10/60s"]
    )
    with ProviderEmulator(tpm=10**6, rpm=10, window_seconds=60.0, output_lengths=[5]) as emu:
        outside = openai.OpenAI(base_url=emu.base_url, api_key="k", max_retries=0)
        for _ in range(6):  # another app on the same key
            outside.chat.completions.create(model="m", max_tokens=5, messages=_msgs(5))
        tracked = track_limits(
            openai.OpenAI(base_url=emu.base_url, api_key="k", max_retries=0), lane="t", ledger=ledger
        )

        @flow
        def one():
            with gate(stage="s", estimate=20, lane="t") as g:
                g.report(tracked.chat.completions.create(model="m", max_tokens=5, messages=_msgs(5)))

        one()
        use = {u["unit"]: u for u in {s["lane"]: s for s in ledger.lanes()}["t"]["limit_use"]}
        # 6 outside + 1 of its own, as the provider counted them, and the outside spend expected before the next
        # count: 6 outside / the 1 request of its own that brings a count in the window
        assert use["requests"]["used"] == 7 + 6
        for _ in range(3):
            outside.chat.completions.create(model="m", max_tokens=5, messages=_msgs(5))
        with pytest.raises(openai.RateLimitError):
            tracked.chat.completions.create(model="m", max_tokens=5, messages=_msgs(5))
        lane = {s["lane"]: s for s in ledger.lanes()}["t"]
        assert lane["paused_until"] is not None and "track_limits" in lane["paused_reason"]
        # a request of the tracked client while the lane is paused waits for the reopen before it is sent
        ledger.set_lane("t", limits=["requests=none"])
        emu.reset()
        left = ledger.paused_for("t")
        assert left > 0.5  # the pause is in force (a minute: the emulator's request window)
        # the ledger's pause ends in 1 s (as if shortened by another process): this process's memory of the 429
        # it heard (the provider's minute) holds while the ledger says paused, and yields once it does not
        ledger._run(
            lambda cur, now: cur.execute("update lane set paused_until = :u where name = 't'", {"u": now + 1.0})
        )
        assert ledger.paused_here("t") > 30
        t0 = time.monotonic()
        tracked.chat.completions.create(model="m", max_tokens=5, messages=_msgs(5))
        assert 0.9 <= time.monotonic() - t0 < 30 and len(emu.records) == 1


def test_track_limits_refuses_what_is_not_a_client_or_a_lane_name():
    from lane_plugin import InvalidInput

    for bad in (5, None, "http://x"):
        with pytest.raises(InvalidInput, match="invalid client .*track_limits needs an openai/anthropic client"):
            track_limits(bad, lane="free")  # once a TypeError, outside the library's errors
    with pytest.raises(InvalidInput, match="invalid lane 5"):
        track_limits(httpx.Client(), lane=5)  # once taken, and every response warned that lane 5 was unknown


def test_a_lease_granted_before_another_workers_429_waits_for_the_reopen_before_its_body(ledger, monkeypatch):
    from lane_plugin.gating.context import Gate

    ledger.set_lane("w", allowance=10**6, ceiling=10**6, burst_tokens=10**5, window_seconds=60.0)
    paused: dict[str, float] = {}
    admitted = Gate._admitted

    def admitted_then_paused(self, led, waited):  # another worker's 429 commits between the grant and the body
        admitted(self, led, waited)
        paused["until"] = led.pause("w", 0.8, reason="a 429 on another job")
        paused["at"] = time.time()

    monkeypatch.setattr(Gate, "_admitted", admitted_then_paused)

    @flow
    def one():
        with gate(stage="s", estimate=20, lane="w") as g:
            started = time.time()
            g.report({"prompt_tokens": 10, "completion_tokens": 5})
        return started, g.job_id

    started, job_id = one()
    assert paused["until"] - paused["at"] > 0.5  # the pause was in force once the lease was held
    assert started >= paused["until"] - 0.01  # the body began only once the lane reopened
    at = ledger._run(lambda cur, now: cur.scalar("select max(at) from rate_charge where job_id = :j", {"j": job_id}))
    assert at >= paused["until"] - 0.01  # its charge counts from when its request went out


def test_the_pause_lasts_until_the_request_fits_not_until_a_limit_with_room_left_is_back_to_full():
    # A tokens limit with room left, not enough for the request: retry-after says when the oldest charges leave
    # and let it in; the limit's reset (back to full) is a window away and is no word on this request.
    req = httpx.Request("POST", "http://x/v1/chat/completions")
    short = httpx.Response(
        429,
        headers={
            "retry-after": "1",
            "retry-after-ms": "300",
            "x-ratelimit-limit-tokens": "1000",
            "x-ratelimit-remaining-tokens": "220",
            "x-ratelimit-reset-tokens": "9.9s",
        },
        request=req,
    )
    said = rate_limit_info(httpx.HTTPStatusError("429", request=req, response=short))
    assert said.seconds == 0.3 and said.source == "retry-after-ms"
    # a limit that ran out: its reset applies (the longest word wins)
    out = httpx.Response(
        429,
        headers={"retry-after-ms": "300", "x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": "2s"},
        request=req,
    )
    assert rate_limit_info(httpx.HTTPStatusError("429", request=req, response=out)).seconds == 2.0
    # nothing but resets: they are all there is to go by
    bare = httpx.Response(
        429, headers={"x-ratelimit-remaining-tokens": "220", "x-ratelimit-reset-tokens": "9.9s"}, request=req
    )
    assert rate_limit_info(httpx.HTTPStatusError("429", request=req, response=bare)).seconds == pytest.approx(9.9)


def test_a_429_trues_the_lane_up_to_the_providers_count_it_carries(ledger):
    # Without track_limits the lane hears the provider only on a 429: its headers hold the provider's count,
    # so the lane reopens knowing the outside spend that made it, not on a window it thinks is empty.
    # A minute's window, so that the pause the 429 leaves is still long when asserted on a loaded machine (with
    # 10 s, a flow that took 5 s to reach its request met a retry-after under the 5 s asserted below).
    ledger.set_lane("q", allowance=10**6, ceiling=10**6, max_leased=10, limits=["tokens=1000/60s"])
    with ProviderEmulator(tpm=1000, rpm=None, window_seconds=60.0, output_lengths=[5]) as emu:
        assert emu.spend_outside(900)  # another client on the key
        client = openai.OpenAI(base_url=emu.base_url, api_key="k", max_retries=0)

        @flow
        def one():
            with gate(stage="s", estimate=200, rate_cost=150, lane="q"):
                client.chat.completions.create(model="m", max_tokens=50, messages=_msgs(100))

        with pytest.raises(openai.RateLimitError):
            one()
        assert [r.status for r in emu.records] == [429]  # the lane's request met the 429
    use = {u["unit"]: u for u in {s["lane"]: s for s in ledger.lanes()}["q"]["limit_use"]}
    # the provider's 900 (all outside: the refused request was not counted), one more 900 expected before the
    # next count (the lane has no request of its own in the window to bring one), and its own attempt's 150
    assert use["tokens"]["used"] >= 900
    assert ledger.paused_for("q") > 5.0


class _Http429(Exception):
    def __init__(self, seconds: float):
        super().__init__("Too Many Requests")
        self.response = type("R", (), {"status_code": 429, "headers": {"retry-after": str(seconds)}})()


def test_after_a_pause_one_request_probes_and_the_others_hold_until_it_returns(ledger):
    from concurrent.futures import ThreadPoolExecutor

    # Blind to a client outside the lane, the lane reopens on the provider's reset with every lease granted
    # at once: all but the first would arrive in the window the first one's 429 closes.
    ledger.set_lane("h", allowance=10**6, ceiling=10**6, burst_tokens=10**5, window_seconds=60.0, max_leased=10)
    starts: list[tuple[float, int]] = []
    ends: list[float] = []
    first_429 = {"left": 1}

    def one(i: int) -> None:
        with gate(stage="s", estimate=20, lane="h") as g:
            starts.append((time.time(), i))
            time.sleep(0.3)
            if first_429["left"]:  # the probe meets the provider's limit again: the lane pauses once more
                first_429["left"] = 0
                ends.append(time.time())
                raise _Http429(0.4)
            ends.append(time.time())
            g.report({"prompt_tokens": 10, "completion_tokens": 5})

    @flow
    def four():
        until = ledger.pause("h", 0.5, reason="a 429 on another job")
        with ThreadPoolExecutor(4) as pool:
            done = [f.exception() for f in [pool.submit(one, i) for i in range(4)]]
        return until, done

    until, errors = four()
    assert sum(isinstance(e, _Http429) for e in errors) == 1 and errors.count(None) == 3  # the 429 happened
    at = sorted(t for t, _ in starts)
    ends.sort()
    assert at[0] >= until - 0.01  # nobody sent into the pause
    assert at[1] >= ends[0] + 0.39  # the probe met a 429: the others waited for it, then for the new pause
    assert at[2] >= at[1] + 0.29 and at[3] >= at[1] + 0.29  # the second probe went alone, and then the rest
    assert at[3] - at[2] < 0.2  # once it returned the lane was open to them together
    # open: for every process (no pause in the row, no probe out), and in this process's memory
    assert ledger.pause_state("h") == (0.0, None, None) and ledger.paused_here("h") == 0.0
