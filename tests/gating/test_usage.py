"""Usage extraction from real SDK response objects (built from the SDKs' own models; no network)."""

from __future__ import annotations

from types import SimpleNamespace as NS

import pytest

from lane_plugin.errors import InvalidInput
from lane_plugin.gating.usage import READER_RETURNS, check_missing_policy, extract_usage, usage_of
from lane_plugin.gating.usage_meter import UsageMeter


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
    refused = []
    assert usage_of({"x": 1}, lambda r: "lots", refused.append) is None  # refused, never raised: the call was served
    assert [str(e) for e in refused] == ["invalid usage 'lots': " + READER_RETURNS]


def test_missing_usage_policy_is_checked():
    assert check_missing_policy("fail") == "fail"
    with pytest.raises(InvalidInput, match="missing_usage 'ignore'"):
        check_missing_policy("ignore")


# -- what providers bill beyond the plain totals --------------------------------------------------
def test_anthropic_prompt_cache_tokens_count_at_their_documented_weights():
    from anthropic.types import CacheCreation, Usage

    from lane_plugin.gating.usage import ANTHROPIC_WEIGHTS

    msg = anthropic_message(50, 200)
    msg.usage = Usage(
        input_tokens=50, output_tokens=200, cache_creation_input_tokens=1000, cache_read_input_tokens=4000
    )
    # input_tokens excludes the cache: writes are billed 1.25x, hits 0.1x a plain input token
    assert (ANTHROPIC_WEIGHTS["cache_creation_input_tokens"], ANTHROPIC_WEIGHTS["cache_read_input_tokens"]) == (
        1.25,
        0.1,
    )
    assert extract_usage(msg) == 50 + 200 + 1250 + 400
    msg.usage = Usage(
        input_tokens=50,
        output_tokens=200,
        cache_creation_input_tokens=1000,
        cache_read_input_tokens=0,
        cache_creation=CacheCreation(ephemeral_5m_input_tokens=200, ephemeral_1h_input_tokens=800),
    )
    assert extract_usage(msg) == 50 + 200 + 250 + 1600  # the split, when given: 1-hour writes cost 2x


def test_cache_weights_can_be_changed_per_task():
    from lane_plugin.gating.usage import weighted_usage

    msg = anthropic_message(10, 5)
    msg.usage.cache_read_input_tokens = 1000
    assert usage_of(msg, weighted_usage(cache_read_input_tokens=1.0)) == 1015
    with pytest.raises(InvalidInput, match="weight"):
        weighted_usage(cache_hits=1.0)
    with pytest.raises(InvalidInput, match="cache_read_input_tokens"):
        weighted_usage(cache_read_input_tokens=-1)


def test_openai_cached_and_reasoning_tokens_are_inside_the_totals_not_added_again():
    from openai.types import CompletionUsage
    from openai.types.completion_usage import CompletionTokensDetails, PromptTokensDetails
    from openai.types.responses import ResponseUsage

    resp = openai_chat(1000, 500)
    resp.usage = CompletionUsage(
        prompt_tokens=1000,
        completion_tokens=500,
        total_tokens=1500,
        prompt_tokens_details=PromptTokensDetails(cached_tokens=800),
        completion_tokens_details=CompletionTokensDetails(reasoning_tokens=300),
    )
    assert extract_usage(resp) == 1500
    resp.usage.total_tokens = None  # some compatible servers omit it: the pair, still without the details
    assert extract_usage(resp) == 1500
    usage = ResponseUsage.model_validate(
        {
            "input_tokens": 900,
            "output_tokens": 400,
            "total_tokens": 1300,
            "input_tokens_details": {"cached_tokens": 700, "cache_write_tokens": 0},
            "output_tokens_details": {"reasoning_tokens": 350},
        }
    )
    assert extract_usage(NS(usage=usage)) == 1300


# -- streams: chunks and events --------------------------------------------------------------------
def openai_chunk(content: str | None, usage: dict | None = None, cid: str = "chatcmpl-s1"):
    from openai.types.chat import ChatCompletionChunk

    choices = [] if content is None else [{"index": 0, "delta": {"content": content}, "finish_reason": None}]
    return ChatCompletionChunk.model_validate(
        {
            "id": cid,
            "object": "chat.completion.chunk",
            "created": 1,
            "model": "gpt-4o-mini",
            "choices": choices,
            "usage": usage,
        }
    )


def test_an_openai_stream_counts_its_usage_chunk_once():
    from lane_plugin.gating.usage_meter import UsageMeter

    meter = UsageMeter()
    final = openai_chunk(None, {"prompt_tokens": 30, "completion_tokens": 12, "total_tokens": 42})
    assert [meter.add(c) for c in (openai_chunk("Hel"), openai_chunk("lo"), final, final)] == [False, False, True, True]
    assert meter.total == 42 and meter.found
    # servers that send cumulative usage on every chunk: the newest figure of each stream
    for n in (5, 9, 20):
        meter.add(openai_chunk("x", {"prompt_tokens": 3, "completion_tokens": n, "total_tokens": 3 + n}, cid="c2"))
    assert meter.total == 42 + 23


def anthropic_stream_events():
    from anthropic.types import (
        MessageDeltaUsage,
        RawContentBlockDeltaEvent,
        RawMessageDeltaEvent,
        RawMessageStartEvent,
        RawMessageStopEvent,
        TextDelta,
        Usage,
    )

    start = anthropic_message(0, 0)
    start.content = []
    start.usage = Usage(input_tokens=100, output_tokens=1, cache_read_input_tokens=1000)
    return [
        RawMessageStartEvent(type="message_start", message=start),
        RawContentBlockDeltaEvent(type="content_block_delta", index=0, delta=TextDelta(type="text_delta", text="Hi")),
        RawMessageDeltaEvent(
            type="message_delta",
            delta={"stop_reason": None, "stop_sequence": None},
            usage=MessageDeltaUsage(output_tokens=120),
        ),
        RawMessageDeltaEvent(
            type="message_delta",
            delta={"stop_reason": "end_turn", "stop_sequence": None},
            usage=MessageDeltaUsage(output_tokens=250),
        ),  # cumulative
        RawMessageStopEvent(type="message_stop"),
    ]


def test_an_anthropic_stream_counts_start_and_cumulative_deltas_once():
    from lane_plugin.gating.usage_meter import UsageMeter

    meter = UsageMeter()
    assert [meter.add(e) for e in anthropic_stream_events()] == [True, False, True, True, False]
    assert meter.total == 100 + 250 + 100  # input + final output + 0.1 x 1000 cache hits
    for e in anthropic_stream_events():  # a second message of another id
        if e.type == "message_start":
            e.message.id = "msg_2"
        meter.add(e)
    assert meter.total == 2 * 450


def test_a_response_reported_and_returned_counts_once_and_text_counts_nothing():
    from lane_plugin.gating.usage_meter import UsageMeter

    meter = UsageMeter()
    resp = openai_chat(10, 5)
    meter.add(resp)
    meter.add(resp)
    meter.add(7)
    meter.add(7)  # ints are token counts: each report adds
    assert meter.total == 29
    with pytest.raises(InvalidInput, match="no token count"):
        meter.add("the text of the answer")
    assert UsageMeter().add(openai_chat(1, 1).model_copy(update={"usage": None})) is False


def test_the_meter_keeps_the_output_the_responses_state_for_the_output_limit():
    m = UsageMeter()
    m.add(openai_chat(900, 60))
    m.add(anthropic_message(100, 40))
    m.add({"usage": {"input_tokens": 10, "cache_read_input_tokens": 5_000, "output_tokens": 7}})
    assert (m.total, m.output) == (960 + 140 + 517, 60 + 40 + 7)
    m.add({"usage": {"total_tokens": 30}})  # says no output: the block's output is no longer known
    assert m.output is None and m.total == 1_647


def test_the_meter_keeps_a_streams_newest_output_once():
    m = UsageMeter()
    start = {"type": "message_start", "message": {"id": "m1", "usage": {"input_tokens": 50, "output_tokens": 1}}}
    m.add(start)
    m.add({"type": "message_delta", "usage": {"output_tokens": 30}})
    m.add({"type": "message_delta", "usage": {"output_tokens": 45}})  # cumulative
    chunk = {"object": "chat.completion.chunk", "id": "c1", "usage": {"prompt_tokens": 8, "completion_tokens": 12}}
    m.add(chunk)
    m.add(chunk)  # the same chunk twice: counted once
    assert (m.total, m.output) == (95 + 20, 45 + 12)


def test_a_bare_count_leaves_the_output_unknown():
    m = UsageMeter()
    assert m.output == 0  # nothing added: nothing generated
    m.add(120)
    assert (m.total, m.output) == (120, None)


def anthropic_message_events(message_id: str, input_tokens: int, outputs: list[int]) -> list:
    """One streamed Anthropic message as the SDK's own event types: its start, cumulative output deltas, its stop."""
    from anthropic.types import (
        MessageDeltaUsage,
        RawMessageDeltaEvent,
        RawMessageStartEvent,
        RawMessageStopEvent,
        Usage,
    )

    start = anthropic_message(0, 0)
    start.id, start.content = message_id, []
    start.usage = Usage(input_tokens=input_tokens, output_tokens=1)
    deltas = [
        RawMessageDeltaEvent(
            type="message_delta",
            delta={"stop_reason": None, "stop_sequence": None},
            usage=MessageDeltaUsage(output_tokens=n),
        )
        for n in outputs
    ]
    return [
        RawMessageStartEvent(type="message_start", message=start),
        *deltas,
        RawMessageStopEvent(type="message_stop"),
    ]


# Two messages streamed at once: 100 in + 50 out, and 10 in + 5 out. A ``message_delta`` names no message: read
# against the newest start of the meter, the first's deltas landed on the second's (billed 116, not 165).
TWO_MESSAGES = (("msg_a", 100, [20, 50]), ("msg_b", 10, [3, 5]))
TWO_MESSAGES_TOTAL, TWO_MESSAGES_OUTPUT = 165, 55


def _interleaved(streams: list[list]) -> list[tuple[int, object]]:
    """(stream index, event) taking one event of each stream in turn."""
    out: list[tuple[int, object]] = []
    for i in range(max(map(len, streams))):
        out += [(k, s[i]) for k, s in enumerate(streams) if i < len(s)]
    return out


def test_two_anthropic_streams_reported_from_two_threads_keep_their_own_messages():
    import queue
    import threading

    m = UsageMeter()
    streams = [anthropic_message_events(*spec) for spec in TWO_MESSAGES]
    inbox = [queue.Queue(), queue.Queue()]
    done = queue.Queue()

    def reader(k: int) -> None:  # one thread per stream, as a body's pool of workers would read them
        while (event := inbox[k].get()) is not None:
            m.add(event)
            done.put(k)

    threads = [threading.Thread(target=reader, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for k, event in _interleaved(streams):  # strictly alternating: each event added before the next is sent
        inbox[k].put(event)
        assert done.get(timeout=10) == k
    for k, t in enumerate(threads):
        inbox[k].put(None)
        t.join()
    assert (m.total, m.output) == (TWO_MESSAGES_TOTAL, TWO_MESSAGES_OUTPUT)


def test_two_anthropic_streams_reported_from_two_asyncio_tasks_keep_their_own_messages():
    import asyncio

    m = UsageMeter()

    async def reader(events: list) -> None:
        for event in events:
            m.add(event)
            await asyncio.sleep(0)  # the other task adds its next event here

    async def main() -> None:
        await asyncio.gather(*(reader(anthropic_message_events(*spec)) for spec in TWO_MESSAGES))

    asyncio.run(main())
    assert (m.total, m.output) == (TWO_MESSAGES_TOTAL, TWO_MESSAGES_OUTPUT)


def test_an_anthropic_message_is_never_undercounted_whatever_thread_reports_its_events():
    # Two outside reviews. A delta is continued only by its own origin's open message: tracked, one stream is one
    # message whatever thread reads it; reported from another thread than its start it counts as a message of its own
    # (more, never less); and a lone delta never lands on another origin's message left open (no stop: the stream
    # broke off), which would have replaced that message's counts (280 billed of 430).
    import threading

    from anthropic.types import MessageDeltaUsage, RawMessageDeltaEvent

    def delta(inp: int, out: int):
        return RawMessageDeltaEvent(
            type="message_delta",
            delta={"stop_reason": "end_turn", "stop_sequence": None},
            usage=MessageDeltaUsage(input_tokens=inp, output_tokens=out),
        )

    def in_thread(fn, *args) -> None:
        t = threading.Thread(target=fn, args=args)
        t.start()
        t.join()

    start, *_, stop = anthropic_message_events("msg_one", 100, [])
    tracked = UsageMeter()
    token = object()  # what track_usage gives the stream
    tracked.add(start, stream=token)
    in_thread(tracked.add, delta(100, 50), None, token)
    tracked.add(stop, stream=token)
    assert (tracked.total, tracked.output) == (150, 50)

    reported = UsageMeter()
    reported.add(start)
    in_thread(reported.add, delta(100, 50))
    reported.add(stop)
    assert reported.total >= 150

    broken = UsageMeter()
    broken.add(start)
    broken.add(delta(100, 50))  # no stop: the stream broke off
    in_thread(broken.add, delta(200, 80))  # another stream's last event, reported alone
    assert broken.total == 150 + 280
