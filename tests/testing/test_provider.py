"""The provider emulator through the real ``openai`` SDK: shapes, streaming, OpenAI's rate limits, quotas, draws.

Rate-limit tests drive the emulator with an injected clock, so a sliding window of
60 s is checked to the half second without sleeping; one test lets the SDK sleep
for a real (1 s) ``retry-after``.
"""

from __future__ import annotations

import time

import openai
import pytest
from openai import OpenAI
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from lane_plugin.testing import ProviderEmulator, count_tokens, find_trace, load_trace, max_in_window


class Clock:
    """A clock the test moves by hand."""

    def __init__(self, t: float = 1000.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


def msgs(tokens: int, tag: str = "") -> list[dict]:
    """One user message of exactly ``tokens`` prompt tokens (4 characters each)."""
    text = (tag + "word" * tokens)[: tokens * 4]
    return [{"role": "user", "content": text}]


def client(emu: ProviderEmulator, retries: int = 0) -> OpenAI:
    return OpenAI(base_url=emu.base_url, api_key="test", max_retries=retries)


def ask(c: OpenAI, prompt: int, max_tokens: int, tag: str = "", **kw) -> ChatCompletion:
    return c.chat.completions.create(model="emu-1", messages=msgs(prompt, tag), max_tokens=max_tokens, **kw)


@pytest.fixture
def clock():
    return Clock()


def test_completion_parses_into_the_sdk_types_with_usage():
    with ProviderEmulator(tpm=10_000, output_lengths=[7]) as emu:
        raw = client(emu).chat.completions.with_raw_response.create(
            model="emu-1", messages=msgs(30) + msgs(12), max_tokens=50
        )
        resp = raw.parse()
    assert isinstance(resp, ChatCompletion)
    assert resp.object == "chat.completion" and resp.choices[0].finish_reason == "stop"
    assert (resp.usage.prompt_tokens, resp.usage.completion_tokens, resp.usage.total_tokens) == (42, 7, 49)
    assert count_tokens(msgs(30) + msgs(12)) == 42
    assert len(resp.choices[0].message.content) == 7 * 4  # 7 one-token words
    assert raw.headers["x-ratelimit-limit-tokens"] == "10000"
    assert raw.headers["x-ratelimit-remaining-tokens"] == str(10_000 - 42 - 50)  # charged prompt + max_tokens
    assert raw.headers["x-ratelimit-limit-requests"] == "3500"
    assert raw.headers["x-ratelimit-remaining-requests"] == "3499"
    assert emu.billed_tokens == 49 and emu.rejected == 0
    [rec] = emu.records
    assert (rec.status, rec.rate_tokens, rec.prompt_tokens, rec.completion_tokens) == (200, 92, 42, 7)


def test_stream_with_include_usage_ends_with_a_usage_chunk():
    with ProviderEmulator(tpm=10_000, output_lengths=[10]) as emu:
        c = client(emu)
        chunks = list(ask(c, 20, 64, stream=True, stream_options={"include_usage": True}))
        plain = list(ask(c, 20, 64, tag="other", stream=True))
    assert all(isinstance(ch, ChatCompletionChunk) for ch in chunks)
    last = chunks[-1]
    assert last.choices == [] and last.usage is not None
    assert (last.usage.prompt_tokens, last.usage.completion_tokens, last.usage.total_tokens) == (20, 10, 30)
    assert all(ch.usage is None for ch in chunks[:-1])
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert len(text) == 10 * 4
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == "stop"
    assert all(ch.usage is None for ch in plain) and plain[-1].choices[0].finish_reason == "stop"
    assert emu.billed_tokens == 60 and all(r.stream for r in emu.records)


def test_exceeding_tpm_raises_rate_limit_error_with_openai_headers(clock):
    with ProviderEmulator(tpm=1000, window_seconds=60, output_lengths=[5], clock=clock) as emu:
        c = client(emu)
        ask(c, 400, 200, tag="a")  # charges 600
        clock.t += 10
        with pytest.raises(openai.RateLimitError) as err:
            ask(c, 300, 200, tag="b")  # 600 + 500 > 1000
    h = err.value.response.headers
    assert err.value.status_code == 429 and err.value.code == "rate_limit_exceeded"
    assert err.value.body["type"] == "tokens" and "TPM" in err.value.body["message"]
    assert h["x-ratelimit-limit-tokens"] == "1000" and h["x-ratelimit-remaining-tokens"] == "400"
    assert h["x-ratelimit-limit-requests"] == "3500" and h["x-ratelimit-remaining-requests"] == "3499"
    assert h["x-ratelimit-reset-tokens"] == "50s" and h["x-ratelimit-reset-requests"] == "50s"
    assert h["retry-after"] == "50" and h["retry-after-ms"] == "50000"  # when the first charge leaves the window
    assert emu.rejected == 1 and emu.billed_tokens == 405  # a refused request is not billed
    assert [r.limit for r in emu.records] == [None, "tokens"]


def test_the_window_slides_a_burst_either_side_of_a_boundary_is_refused(clock):
    clock.t = 0.0
    with ProviderEmulator(tpm=1000, window_seconds=60, output_lengths=[1], clock=clock) as emu:
        c = client(emu)
        clock.t = 59.5
        ask(c, 100, 800, tag="before")  # charges 900 just before the minute a fixed window would start
        clock.t = 60.5
        with pytest.raises(openai.RateLimitError) as err:
            ask(c, 100, 800, tag="after")  # a fixed, aligned window would admit this: 1800 in one second
        assert err.value.response.headers["retry-after-ms"] == "59000"
        clock.t = 119.0
        with pytest.raises(openai.RateLimitError):
            ask(c, 100, 800, tag="still")
        clock.t = 119.5  # the first charge leaves the window exactly now
        ask(c, 100, 800, tag="now")
        ask(c, 10, 80, tag="small")
        assert emu.max_window_tokens() == 990 <= emu.tpm
        assert emu.max_window_tokens(window_seconds=61) == 1890  # a longer span sees both bursts


def test_rpm_is_a_sliding_count_of_requests(clock):
    with ProviderEmulator(tpm=10**6, rpm=2, window_seconds=10, output_lengths=[1], clock=clock) as emu:
        c = client(emu)
        ask(c, 5, 5, tag="1")
        clock.t += 4
        ask(c, 5, 5, tag="2")
        clock.t += 5
        with pytest.raises(openai.RateLimitError) as err:
            ask(c, 5, 5, tag="3")
        assert err.value.body["type"] == "requests" and err.value.response.headers["retry-after-ms"] == "1000"
        clock.t += 1
        ask(c, 5, 5, tag="4")
        assert [r.status for r in emu.records] == [200, 200, 429, 200]


def test_daily_quota_counts_billed_tokens_and_resets_the_next_day(clock):
    with ProviderEmulator(tpm=10**6, daily_tokens=100, day_seconds=3600, output_lengths=[20], clock=clock) as emu:
        c = client(emu)
        ask(c, 30, 500, tag="a")  # bills 50 though it was charged 530 rate tokens
        ask(c, 30, 500, tag="b")  # 50 + 30 <= 100: admitted, bills 50 more: 100
        with pytest.raises(openai.RateLimitError) as err:
            ask(c, 1, 500, tag="c")
        assert "per day" in err.value.body["message"]
        assert err.value.response.headers["retry-after"] == "3600"
        clock.t += 3600
        ask(c, 1, 500, tag="d")
        assert emu.billed_tokens == 121 and emu.rejected == 1


def test_request_larger_than_tpm_is_refused_without_retry_after(clock):
    with ProviderEmulator(tpm=100, output_lengths=[1], clock=clock) as emu:
        with pytest.raises(openai.RateLimitError) as err:
            ask(client(emu), 50, 51)
    assert "too large" in err.value.body["message"] and "retry-after" not in err.value.response.headers


def test_output_lengths_are_deterministic_for_a_seed_and_capped_at_max_tokens():
    lengths = list(range(1, 200))

    def run(seed: int) -> list[tuple[int, str]]:
        with ProviderEmulator(tpm=10**7, output_lengths=lengths, seed=seed) as emu:
            c = client(emu)
            return [
                (r.usage.completion_tokens, r.choices[0].finish_reason)
                for r in (ask(c, 10, 100, tag=f"q{i}") for i in range(12))
            ]

    first, again, other = run(7), run(7), run(8)
    assert first == again and first != other
    for n, reason in first:
        assert n <= 100 and reason == ("length" if n == 100 else "stop")
    assert any(reason == "length" for _, reason in first + other)  # half the lengths exceed the cap


def test_output_lengths_come_from_the_real_trace():
    try:
        rows = load_trace("azure-code")
    except FileNotFoundError as exc:
        pytest.skip(str(exc))
    assert find_trace("azure-code").name == "AzureLLMInferenceTrace_code.csv" and len(rows) > 8000
    trace_outputs = {o for _, o in rows}
    with ProviderEmulator(tpm=10**7, seed=3) as emu:
        c = client(emu)
        got = [ask(c, 10, 4096, tag=f"t{i}").usage.completion_tokens for i in range(20)]
    assert set(got) <= trace_outputs and len(set(got)) > 3


def test_the_sdk_retries_after_the_retry_after_it_is_given():
    with ProviderEmulator(tpm=1000, window_seconds=1.0, output_lengths=[1]) as emu:
        ask(client(emu), 100, 800, tag="first")
        t0 = time.monotonic()
        resp = ask(client(emu, retries=2), 100, 800, tag="second")
        waited = time.monotonic() - t0
    assert resp.usage.prompt_tokens == 100
    assert [r.status for r in emu.records] == [200, 429, 200]
    assert 0.5 < waited < 3.0
    assert emu.max_window_tokens() <= 1000


def test_max_in_window_and_errors():
    assert max_in_window([], 60) == (0, 0.0)
    assert max_in_window([(0, 3), (59.9, 3), (60, 3), (200, 1)], 60)[0] == 6
    with ProviderEmulator(tpm=100, output_lengths=[1]) as emu:
        c = client(emu)
        with pytest.raises(openai.BadRequestError):
            c.chat.completions.create(model="emu-1", messages=[], max_tokens=5)
        with pytest.raises(openai.BadRequestError):
            c.chat.completions.create(model="emu-1", messages=msgs(3), max_tokens=0)
        with pytest.raises(openai.NotFoundError):
            c.embeddings.create(model="emu-1", input="x")
    with pytest.raises(RuntimeError):
        _ = ProviderEmulator(tpm=100, output_lengths=[1]).base_url


def test_a_request_sent_after_a_429s_answer_is_sent_into_the_closed_window_one_begun_before_is_in_flight():
    with ProviderEmulator(tpm=10**6, rpm=1, window_seconds=60, output_lengths=[5]) as emu:
        c = client(emu)
        ask(c, 10, 5, tag="a")
        begun = time.time()  # a call begun here, whose bytes arrive only after the 429 below
        with pytest.raises(openai.RateLimitError):
            ask(c, 10, 5, tag="b")
        end = time.monotonic() + 5  # the emulator stamps the answer just after writing it: the client may read first
        while emu.records[1].t_answered is None and time.monotonic() < end:
            time.sleep(0.01)
        refused = emu.records[1]
        assert refused.status == 429 and refused.t_answered is not None  # the 429 was answered: the window closed
        assert emu.stats()["sent_into_closed"] == emu.stats()["in_flight_at_429"] == 0
        for tag, headers in (
            ("c", {"x-client-sent-at": repr(begun)}),
            ("d", {}),
            ("e", {"x-client-sent-at": repr(time.time())}),
        ):
            with pytest.raises(openai.RateLimitError):
                ask(c, 10, 5, tag=tag, extra_headers=headers)
        stats = emu.stats()
    # begun before the answer went out: in flight; stamped after it, or unstamped (its arrival): sent into it
    assert (stats["in_flight_at_429"], stats["sent_into_closed"]) == (1, 2)
    assert [a["into_closed"] for a in stats["closed_arrivals"]] == [False, True, True]
    assert stats["closed_arrivals"][0]["sent_after_answer"] < 0 < stats["closed_arrivals"][1]["sent_after_answer"]
