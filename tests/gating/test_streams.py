"""Usage capture over real HTTP: the openai SDK against the provider emulator, inside gated Prefect tasks.

Each test compares the ledger's bill with what the emulator itself billed:
streamed answers (iterated with ``track_usage`` or ``report_usage`` per chunk,
or returned un-iterated), tasks that return text, and streams that carry no
usage (billed by estimate, marked so).
"""

from __future__ import annotations

import asyncio
import logging

import pytest
from openai import AsyncOpenAI, OpenAI
from prefect import flow

from lane_plugin import gate, lane_task, report_usage, track_usage
from lane_plugin.gating.streams import AsyncReplayedStream, ReplayedStream
from lane_plugin.testing import ProviderEmulator

from ..tables import job_rows, settlements

pytestmark = [pytest.mark.usefixtures("prefect_server"), pytest.mark.timeout(120)]
MESSAGES = [{"role": "user", "content": "Write a haiku about token budgets, please."}]
EST = 400


@pytest.fixture(scope="module")
def emu():
    with ProviderEmulator(tpm=10_000_000, rpm=None, output_lengths=[37, 90, 12, 64], seed=3) as e:
        yield e


def client(emu) -> OpenAI:
    return OpenAI(base_url=emu.base_url, api_key="test", max_retries=0)


def stream(emu, include_usage: bool = True):
    opts = {"stream_options": {"include_usage": True}} if include_usage else {}
    return client(emu).chat.completions.create(model="emu-1", messages=MESSAGES, max_tokens=200, stream=True, **opts)


def _billed(emu, since: int) -> int:
    return sum(r.billed for r in emu.records[since:])


def _one(ledger) -> tuple[dict, dict]:
    [job] = job_rows(ledger)
    [s] = settlements(ledger)
    return job, s


def test_a_stream_iterated_with_track_usage_is_billed_its_final_usage(ledger, emu):
    before = len(emu.records)

    @lane_task(stage="haiku", estimate=EST)
    def haiku() -> str:
        return "".join(c.choices[0].delta.content or "" for c in track_usage(stream(emu)) if c.choices)

    @flow
    def f():
        return haiku()

    text = f()
    job, s = _one(ledger)
    assert text and s["actual"] == _billed(emu, before) > 0 and not s["by_estimate"]
    assert ledger.audit() == []


def test_report_usage_on_every_chunk_bills_the_stream_once(ledger, emu):
    before = len(emu.records)

    @lane_task(stage="haiku", estimate=EST)
    def haiku() -> str:
        parts = []
        for chunk in stream(emu):
            report_usage(chunk)  # chunks without usage add nothing
            if chunk.choices:
                parts.append(chunk.choices[0].delta.content or "")
        return "".join(parts)

    @flow
    def f():
        return haiku()

    f()
    job, s = _one(ledger)
    assert s["actual"] == _billed(emu, before) and not s["by_estimate"]


def test_a_returned_stream_is_read_inside_the_lease_and_replayed(ledger, emu):
    before = len(emu.records)

    @lane_task(stage="haiku", estimate=EST)
    def haiku():
        return stream(emu)  # not iterated here: the gate reads it to its end before settling

    @flow
    def f():
        return haiku()

    replay = f()
    job, s = _one(ledger)
    assert isinstance(replay, ReplayedStream) and replay.response.status_code == 200
    text = "".join(c.choices[0].delta.content or "" for c in replay if c.choices)
    assert len(text) == 4 * emu.records[-1].completion_tokens  # the emulator's words are 4 characters
    assert s["actual"] == _billed(emu, before) and not s["by_estimate"]


def test_a_returned_async_stream_is_read_inside_the_lease(ledger, emu):
    before = len(emu.records)

    @lane_task(stage="haiku", estimate=EST)
    async def haiku():
        api = AsyncOpenAI(base_url=emu.base_url, api_key="test", max_retries=0)
        return await api.chat.completions.create(
            model="emu-1", messages=MESSAGES, max_tokens=200, stream=True, stream_options={"include_usage": True}
        )

    @flow
    async def f():
        replay = await haiku()
        return replay, [c async for c in replay]

    replay, chunks = asyncio.run(f())
    job, s = _one(ledger)
    assert isinstance(replay, AsyncReplayedStream) and chunks[-1].usage is not None
    assert s["actual"] == chunks[-1].usage.total_tokens == _billed(emu, before)


def test_a_stream_without_usage_is_billed_by_estimate_and_marked(ledger, emu, caplog):
    @lane_task(stage="haiku", estimate=EST)
    def haiku() -> str:
        return "".join(
            c.choices[0].delta.content or "" for c in track_usage(stream(emu, include_usage=False)) if c.choices
        )

    @flow
    def f():
        return haiku()

    with caplog.at_level(logging.WARNING):
        f()
    job, s = _one(ledger)
    assert (s["actual"], bool(s["by_estimate"])) == (EST, True)
    assert [r["by_estimate"] for r in ledger.settled_jobs()] == [True]
    assert any("billing its estimate" in r.getMessage() for r in caplog.records)


def test_a_task_that_returns_text_reports_the_response_first(ledger, emu):
    before = len(emu.records)

    @lane_task(stage="answer", estimate=EST)
    def answer() -> str:
        resp = client(emu).chat.completions.create(model="emu-1", messages=MESSAGES, max_tokens=200)
        report_usage(resp)  # the documented pattern: the text is returned, the usage reported
        return resp.choices[0].message.content

    @lane_task(stage="answer", estimate=EST)
    def careless() -> str:
        return (
            client(emu)
            .chat.completions.create(model="emu-1", messages=MESSAGES, max_tokens=200)
            .choices[0]
            .message.content
        )

    @lane_task(stage="answer", estimate=EST)
    def both():
        resp = client(emu).chat.completions.create(model="emu-1", messages=MESSAGES, max_tokens=200)
        report_usage(resp)
        return resp  # reported and returned: counted once

    @flow
    def f():
        return answer(), careless(), both()

    f()
    bills = [(s["actual"], bool(s["by_estimate"])) for s in settlements(ledger)]
    recs = emu.records[before:]
    assert bills == [(recs[0].billed, False), (EST, True), (recs[2].billed, False)]


def test_anthropic_stream_events_reported_in_a_gate_block(ledger):
    from .test_usage import anthropic_stream_events

    @flow
    def f():
        with gate(stage="critique", estimate=900) as g:
            for event in anthropic_stream_events():
                report_usage(event)
        return g.job_id

    jid = f()
    assert ledger.job(jid)["actual"] == 450


def test_two_anthropic_streams_tracked_in_one_thread_bill_each_message_whole(ledger):
    from .test_usage import TWO_MESSAGES, TWO_MESSAGES_TOTAL, anthropic_message_events

    @flow
    def f():
        with gate(stage="critique", estimate=900) as g:
            a, b = (iter(track_usage(anthropic_message_events(*spec))) for spec in TWO_MESSAGES)
            for pair in zip(a, b):  # read in turns, one thread: each stream's deltas are its own message's
                assert len(pair) == 2
        return g.job_id

    assert ledger.job(f())["actual"] == TWO_MESSAGES_TOTAL
