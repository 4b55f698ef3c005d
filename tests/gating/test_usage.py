"""Usage extraction from real SDK response objects (built from the SDKs' own models; no network)."""

from __future__ import annotations

from types import SimpleNamespace as NS

import pytest

from lane_plugin.errors import InvalidInput
from lane_plugin.gating.usage import check_missing_policy, extract_usage, usage_of


def openai_chat(prompt: int, completion: int, total: int | None = None):
    from openai.types import CompletionUsage
    from openai.types.chat import ChatCompletion

    return ChatCompletion.model_validate(
        {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "created": 1700000000,
            "model": "gpt-4o-mini",
            "choices": [
                {
                    "index": 0,
                    "finish_reason": "stop",
                    "message": {"role": "assistant", "content": "a summary"},
                }
            ],
            "usage": CompletionUsage(
                prompt_tokens=prompt, completion_tokens=completion, total_tokens=total or prompt + completion
            ).model_dump(),
        }
    )


def anthropic_message(inp: int, out: int):
    from anthropic.types import Message, TextBlock, Usage

    return Message(
        id="msg_1",
        type="message",
        role="assistant",
        model="claude-sonnet-4-5",
        content=[TextBlock(type="text", text="a critique")],
        stop_reason="end_turn",
        stop_sequence=None,
        usage=Usage(input_tokens=inp, output_tokens=out),
    )


def test_openai_chat_completion_uses_total_tokens():
    resp = openai_chat(1200, 340)
    assert type(resp.usage).__name__ == "CompletionUsage"
    assert extract_usage(resp) == 1540


def test_openai_total_tokens_wins_over_the_sum():
    # total_tokens is what the provider bills (it can include reasoning tokens not in the pair)
    assert extract_usage(openai_chat(100, 50, total=400)) == 400


def test_openai_responses_api_usage():
    from openai.types.responses import ResponseUsage

    usage = ResponseUsage.model_validate(
        {
            "input_tokens": 70,
            "output_tokens": 30,
            "total_tokens": 100,
            "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
            "output_tokens_details": {"reasoning_tokens": 0},
        }
    )
    assert extract_usage(NS(usage=usage)) == 100


def test_anthropic_message_sums_input_and_output():
    resp = anthropic_message(900, 211)
    assert type(resp.usage).__name__ == "Usage"
    assert extract_usage(resp) == 1111


def test_litellm_shaped_and_dict_responses():
    assert extract_usage(NS(usage=NS(prompt_tokens=10, completion_tokens=5, total_tokens=None))) == 15
    assert extract_usage({"usage": {"total_tokens": 77}}) == 77
    assert extract_usage({"usage": {"input_tokens": 3, "output_tokens": 4}}) == 7
    assert extract_usage({"usage": 12}) == 12
    assert extract_usage(openai_chat(5, 6).model_dump()) == 11


@pytest.mark.parametrize("obj", [None, "text", b"x", {"content": "no usage"}, NS(text="hi"), -3, 1.5, True])
def test_no_usage_found(obj):
    assert extract_usage(obj) is None


def test_ints_are_usage():
    assert extract_usage(0) == 0
    assert extract_usage(1234) == 1234


def test_usage_reader_option():
    assert usage_of({"meta": {"tok": 9}}, lambda r: r["meta"]["tok"]) == 9
    assert usage_of(anthropic_message(1, 2), lambda r: r) == 3
    assert usage_of({"x": 1}, lambda r: None) is None
    with pytest.raises(InvalidInput, match="usage"):
        usage_of({"x": 1}, lambda r: "lots")


def test_missing_usage_policy_is_checked():
    assert check_missing_policy("fail") == "fail"
    with pytest.raises(InvalidInput, match="missing_usage 'ignore'"):
        check_missing_policy("ignore")
