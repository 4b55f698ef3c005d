"""The emulator's Anthropic Messages endpoint through the real ``anthropic`` SDK: shapes, headers, input and
output token limits (output counted as generated), a shared key's outside spending (issue 24)."""

from __future__ import annotations

import anthropic
import pytest

from lane_plugin.gating.ratelimits import rate_limit_info, remaining_of
from lane_plugin.testing import ProviderEmulator


class Clock:
    def __init__(self, t: float = 1000.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


def _client(emu: ProviderEmulator) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=emu.base_url.removesuffix("/v1"), api_key="k", max_retries=0)


def _ask(c: anthropic.Anthropic, prompt: int, max_tokens: int = 100, tag: str = ""):
    return c.messages.with_raw_response.create(
        model="claude-emu",
        max_tokens=max_tokens,
        messages=[{"role": "user", "content": (tag + "word" * prompt)[: prompt * 4]}],
    )


def test_messages_answer_in_anthropics_shape_with_its_rate_limit_headers():
    with ProviderEmulator(tpm=10**9, rpm=50, itpm=1_000, otpm=500, output_lengths=[30], sleep=lambda s: None) as emu:
        raw = _ask(_client(emu), 10)
        msg = raw.parse()
        assert isinstance(msg, anthropic.types.Message) and msg.stop_reason == "end_turn"
        assert (msg.usage.input_tokens, msg.usage.output_tokens) == (10, 30)
        h = raw.headers
        assert h["anthropic-ratelimit-input-tokens-remaining"] == "990"
        assert h["anthropic-ratelimit-requests-remaining"] == "49"
        assert h["anthropic-ratelimit-output-tokens-reset"].endswith("Z")
        # output counted as generated: the next answer's headers show the 30 generated
        assert _ask(_client(emu), 10, tag="b").headers["anthropic-ratelimit-output-tokens-remaining"] == "470"
        assert remaining_of(h) == {"requests": 1, "input_tokens": 10, "output_tokens": 0}


def test_input_and_output_limits_refuse_with_a_rate_limit_error_the_gate_reads():
    clock = Clock()
    with ProviderEmulator(
        tpm=10**9,
        rpm=None,
        itpm=100,
        otpm=60,
        window_seconds=60.0,
        output_lengths=[40],
        clock=clock,
        sleep=lambda s: None,
    ) as emu:
        c = _client(emu)
        _ask(c, 50)
        with pytest.raises(anthropic.RateLimitError) as err:
            _ask(c, 60, tag="x")  # 50 + 60 input > 100
        assert emu.records[-1].limit == "input_tokens"
        said = rate_limit_info(err.value)
        assert said is not None and said.seconds == pytest.approx(60.0, abs=1.0)
        clock.t += 10
        _ask(c, 10, tag="y")  # output 40 + 40 generated = 80 > 60 now: the window is full for the next
        with pytest.raises(anthropic.RateLimitError):
            _ask(c, 10, tag="z")
        assert emu.records[-1].limit == "output_tokens"
        assert emu.stats()["sent_into_closed"] == 2  # each after a 429 that said to wait a minute
        clock.t += 61
        _ask(c, 10, tag="w")


def test_spending_from_outside_the_lane_uses_the_shared_limits():
    clock = Clock()
    with ProviderEmulator(
        tpm=1_000, rpm=None, window_seconds=60.0, output_lengths=[1], clock=clock, sleep=lambda s: None
    ) as emu:
        assert emu.spend_outside(400, max_tokens=100) and emu.spend_outside(400, max_tokens=100)
        assert not emu.spend_outside(1, max_tokens=1)  # the window is full: refused, not charged
        assert emu.stats()["outside_ok"] == 2 and emu.stats()["outside_refused"] == 1 and emu.records == []
        clock.t += 60
        assert emu.spend_outside(1)
