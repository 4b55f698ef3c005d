"""A usage count that is not a count (NaN, negative, fractional, a string, past 10**12) is refused.

It used to be dropped field by field: ``{"prompt_tokens": -5, "completion_tokens": 20}`` billed 20 and
``{"input_tokens": nan, "output_tokens": 10}`` billed 10, without a word. Now the whole block is refused
(not counted: the gate bills at least the estimate, ``by_estimate``) and one warning names the field and
the value."""

from __future__ import annotations

import logging
import math
from types import SimpleNamespace as NS

import numpy as np
import pytest

from lane_plugin.gating.usage import extract_usage, usage_of
from lane_plugin.gating.usage_meter import UsageMeter

NAN, INF = math.nan, math.inf
MALFORMED = [  # (usage block, the field and value the warning names)
    ({"prompt_tokens": -5, "completion_tokens": 20}, "prompt_tokens -5"),
    ({"input_tokens": NAN, "output_tokens": 10}, "input_tokens nan"),
    ({"total_tokens": 12.5}, "total_tokens 12.5"),
    ({"prompt_tokens": 5, "completion_tokens": "7"}, "completion_tokens '7'"),
    ({"total_tokens": 40, "prompt_tokens": -1, "completion_tokens": 41}, "prompt_tokens -1"),
    ({"input_tokens": 3, "output_tokens": 4, "cache_read_input_tokens": -100}, "cache_read_input_tokens -100"),
    (
        {"input_tokens": 3, "output_tokens": 4, "cache_creation": {"ephemeral_1h_input_tokens": INF}},
        "ephemeral_1h_input_tokens inf",
    ),
    ({"total_tokens": 10**13}, "total_tokens 10000000000000"),
    ({"prompt_tokens": True, "completion_tokens": 3}, "prompt_tokens True"),
    # a part above the total that counts it: which of the two is wrong is unknowable, so neither is billed
    ({"total_tokens": 10, "prompt_tokens": 4, "completion_tokens": 50}, "completion_tokens 50"),
    ({"total_tokens": 10, "input_tokens": 11, "output_tokens": 0}, "input_tokens 11"),
    ({"total_tokens": 1000, "prompt_tokens": 994, "completion_tokens": 40}, "total_tokens 1000"),
]


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


@pytest.mark.parametrize("block, named", MALFORMED, ids=[n for _, n in MALFORMED])
def test_a_malformed_count_makes_the_block_no_usage_with_one_warning_naming_it(caplog, block, named):
    for obj in ({"usage": block}, block, NS(usage=NS(**{k: v for k, v in block.items()}))):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="lane_plugin.gate"):
            assert extract_usage(obj) is None, obj
        [said] = _warnings(caplog)
        assert f"invalid {named}:" in said and "not counted" in said and "\n" not in said, said


@pytest.mark.parametrize("usage", [-3, 2.5, NAN, True, 10**13])
def test_a_malformed_usage_count_itself_is_no_usage(caplog, usage):
    with caplog.at_level(logging.WARNING, logger="lane_plugin.gate"):
        assert extract_usage({"usage": usage}) is None
    assert any("invalid usage" in w for w in _warnings(caplog)), _warnings(caplog)


def test_valid_counts_read_as_documented_and_say_nothing(caplog):
    with caplog.at_level(logging.WARNING, logger="lane_plugin.gate"):
        assert extract_usage({"usage": {"prompt_tokens": 12, "completion_tokens": 30}}) == 42
        assert extract_usage({"usage": {"total_tokens": 12.0}}) == 12  # a whole float is a count
        assert extract_usage({"usage": {"prompt_tokens": np.int64(5), "completion_tokens": np.int32(6)}}) == 11
        assert extract_usage({"usage": {"input_tokens": 0, "output_tokens": 0}}) == 0
        assert extract_usage({"usage": {"total_tokens": None, "prompt_tokens": 3}}) == 3  # None is absent
        assert extract_usage({"usage": 10**12}) == 10**12
    assert _warnings(caplog) == []


def test_a_usage_reader_returning_a_malformed_block_is_no_usage_not_an_error(caplog):
    with caplog.at_level(logging.WARNING, logger="lane_plugin.gate"):
        assert usage_of({"u": {"prompt_tokens": -5, "completion_tokens": 20}}, lambda r: r["u"]) is None
    assert any("invalid prompt_tokens -5" in w for w in _warnings(caplog))


def openai_chunk(usage):
    return {"object": "chat.completion.chunk", "id": "c1", "choices": [], "usage": usage}


@pytest.mark.parametrize(
    "events, named",
    [
        (
            [openai_chunk(None), openai_chunk({"prompt_tokens": 10, "completion_tokens": NAN, "total_tokens": NAN})]
            * 2,
            "total_tokens nan",
        ),
        (
            [
                {"type": "message_start", "message": {"id": "m1", "usage": {"input_tokens": 25, "output_tokens": 1}}},
                {"type": "message_delta", "usage": {"output_tokens": -3}},
            ],
            "output_tokens -3",
        ),
        (
            [{"type": "response.completed", "response": {"id": "r1", "usage": {"total_tokens": 1.5}}}],
            "total_tokens 1.5",
        ),
        ([7, {"usage": {"prompt_tokens": 4, "completion_tokens": -4}}], "completion_tokens -4"),
        (
            [
                {
                    "type": "response.completed",
                    "response": {"id": "r2", "usage": {"total_tokens": 9, "output_tokens": 12}},
                }
            ],
            "output_tokens 12",
        ),
    ],
    ids=["openai", "anthropic", "responses", "plain", "output-above-total"],
)
def test_a_stream_or_report_with_a_malformed_count_marks_the_meter(caplog, events, named):
    meter = UsageMeter()
    with caplog.at_level(logging.WARNING, logger="lane_plugin.gate"):
        for e in events:
            meter.add(e)
    assert meter.malformed
    said = _warnings(caplog)
    assert len(said) == 1 and f"invalid {named}:" in said[0], said  # once per meter, however often it comes


def test_a_meter_of_valid_usage_is_not_malformed():
    meter = UsageMeter()
    meter.add(openai_chunk({"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}))
    meter.add(3)
    assert (meter.total, meter.found, meter.malformed) == (18, True, False)
