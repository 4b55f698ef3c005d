"""How the send guard is installed (send_guard.install) and where its async work runs: it wraps a send another
library wrapped first (vcrpy's stub uses functools.wraps), never twice, warns once when nothing can be patched,
patches nothing with LANE_SEND_GUARD=false, and keeps an async client's ledger work off the event loop. The
install tests use a stand-in httpx package (its two classes, nothing sent); the async ones the real openai SDK
against the emulator, the ledger on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import functools
import importlib.abc
import logging
import sys
import threading
import time
import types

import openai
import pytest

from lane_plugin import gate
from lane_plugin.gating import get_ledger, send_guard
from lane_plugin.testing import ProviderEmulator

pytestmark = pytest.mark.timeout(120)


def _package(name: str, with_send: bool = True, async_meta: type = type) -> types.ModuleType:
    """A stand-in httpx package: Client and AsyncClient with the send the guard patches (or without it)."""
    module = types.ModuleType(name)
    module.__version__ = "0.99"
    if with_send:

        class Client:
            def _send_single_request(self, request):
                return "answer"

        class AsyncClient(metaclass=async_meta):
            async def _send_single_request(self, request):
                return "answer"
    else:

        class Client:  # type: ignore[no-redef]
            pass

        class AsyncClient:  # type: ignore[no-redef]
            pass

    module.Client, module.AsyncClient = Client, AsyncClient
    return module


@pytest.fixture
def fresh(monkeypatch):
    """The guard as in a new process, over the stand-in packages a test puts in ``sys.modules``."""
    monkeypatch.setattr(send_guard, "_modules", {})
    monkeypatch.setattr(send_guard, "_installed", False)

    def use(*modules: types.ModuleType, also: tuple[str, ...] = ()) -> None:
        for m in modules:
            monkeypatch.setitem(sys.modules, m.__name__, m)
        monkeypatch.setattr(send_guard, "PACKAGES", tuple(m.__name__ for m in modules) + also)

    return use


def _guard_layers(send) -> int:
    """How many of the guard's wrappers are on ``send`` (through any other library's functools.wraps)."""
    layers = 0
    while send is not None:
        layers += send_guard._ours(send) is not None
        send = getattr(send, "__wrapped__", None)
    return layers


def test_a_send_another_library_wrapped_with_functools_wraps_is_guarded(fresh):
    fake = _package("fake_recorded")
    real = fake.Client._send_single_request
    recorded = []

    @functools.wraps(real)
    def recorder(self, request):  # vcrpy's httpx stub, installed before the first gate
        recorded.append(request)
        return real(self, request)

    fake.Client._send_single_request = recorder
    fresh(fake)
    assert send_guard.install()
    assert _guard_layers(fake.Client._send_single_request) == 1  # the guard is on, around the recorder
    assert fake.Client._send_single_request.__wrapped__ is recorder
    assert fake.Client()._send_single_request("req") == "answer" and recorded == ["req"]  # outside a gate: passes


def test_a_recorder_on_top_keeps_the_guard_and_one_that_puts_the_original_back_is_guarded_again(fresh):
    fake = _package("fake_on_top")
    fresh(fake)
    original = fake.Client._send_single_request
    assert send_guard.install()
    guarded = fake.Client._send_single_request

    @functools.wraps(guarded)  # copies the guard's mark: not the guard's own wrapper for all that
    def recorder(self, request):
        return guarded(self, request)

    fake.Client._send_single_request = recorder  # a cassette opens after the guard
    send_guard.install()  # the next gate
    assert fake.Client._send_single_request is recorder and _guard_layers(recorder) == 1
    fake.Client._send_single_request = original  # the cassette closes, putting back what it found first
    send_guard.install()
    assert _guard_layers(fake.Client._send_single_request) == 1  # guarded again, once


def test_two_first_gates_installing_at_once_leave_one_guard_on_each_send(fresh):
    # B reads Client's send before A patches and AsyncClient's after (forced: B stops between its reads).
    a_done, b_between = threading.Event(), threading.Event()

    class Interleave(type):
        def __getattribute__(cls, name):
            if name == "_send_single_request" and threading.current_thread().name == "B" and not a_done.is_set():
                b_between.set()
                a_done.wait(10)
            return type.__getattribute__(cls, name)

    fake = _package("fake_race", async_meta=Interleave)
    fresh(fake)
    b = threading.Thread(target=send_guard.install, name="B")
    b.start()
    assert b_between.wait(10)
    send_guard.install()  # A
    a_done.set()
    b.join(10)
    assert _guard_layers(fake.Client._send_single_request) == 1
    assert _guard_layers(type.__getattribute__(fake.AsyncClient, "_send_single_request")) == 1


class _CountImports(importlib.abc.MetaPathFinder):
    def __init__(self, name: str):
        self.name, self.looked = name, 0

    def find_spec(self, fullname, path, target=None):
        if fullname == self.name:
            self.looked += 1
        return None


def test_with_no_httpx_to_patch_the_warning_is_once_per_process_and_nothing_is_imported(fresh, caplog, monkeypatch):
    # install() runs in a gated thread under its lease: it takes a package from sys.modules and never imports one
    # (an import there costs the lease's time, and a timeout raised into it could leave the import lock held)
    fresh(_package("fake_old", with_send=False), also=("fake_not_imported",))
    finder = _CountImports("fake_not_imported")
    monkeypatch.setattr(sys, "meta_path", [finder, *sys.meta_path])
    caplog.set_level(logging.WARNING, logger="lane_plugin.send_guard")
    said = [send_guard.install() for _ in range(3)]  # three gates
    assert said == [False, False, False]
    warned = [r.getMessage() for r in caplog.records if "has no _send_single_request" in r.getMessage()]
    assert len(warned) == 1 and "fake_old 0.99" in warned[0]
    assert finder.looked == 0 and "fake_not_imported" not in sys.modules
    later = _package("fake_not_imported")  # the body imports the SDK (and its httpx) itself: the next gate patches
    monkeypatch.setitem(sys.modules, later.__name__, later)
    assert send_guard.install()
    assert _guard_layers(later.Client._send_single_request) == 1


def test_lane_send_guard_false_patches_nothing(fresh, monkeypatch):
    fake = _package("fake_off")
    fresh(fake)
    original = fake.Client._send_single_request, fake.AsyncClient._send_single_request
    monkeypatch.setenv("LANE_SEND_GUARD", "false")
    assert not send_guard.install()
    assert (fake.Client._send_single_request, fake.AsyncClient._send_single_request) == original
    monkeypatch.delenv("LANE_SEND_GUARD")
    assert send_guard.install()  # on again: the next gate patches
    assert _guard_layers(fake.Client._send_single_request) == 1


# -- an async client: the guard's ledger work runs in a thread, not on the event loop ---------------------------
SLOW = 1.5  # a ledger call that takes this long (a loaded database): the event loop must keep running meanwhile
# (a blocked loop stalls SLOW or more; a loaded CI machine stalled a free one 0.34 s, so SLOW/2 tells them apart)
CALL = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "word " * 40}]}


@pytest.fixture
def led(ledger_url, monkeypatch):
    monkeypatch.setenv("LANE_DATABASE_URL", ledger_url)
    led = get_ledger(ledger_url)
    led.set_lane("a", allowance=10**6, ceiling=10**6, max_leased=10)
    yield led
    led.close()


def _slowed(led, monkeypatch, name: str) -> list[float]:
    """Make ``led.<name>`` take SLOW seconds longer; returns the times each call began."""
    began: list[float] = []
    real = getattr(led, name)

    def slow(*args, **kwargs):
        began.append(time.monotonic())
        time.sleep(SLOW)
        return real(*args, **kwargs)

    monkeypatch.setattr(led, name, slow)
    return began


async def _longest_stall(work) -> float:
    """Run ``work`` beside a ticker on the same loop; the longest the ticker went without a turn (seconds)."""
    ticks: list[float] = []
    done = asyncio.Event()

    async def ticker() -> None:
        while True:
            ticks.append(time.monotonic())  # also the turn after ``work`` ends: a stall at its very end counts
            if done.is_set():
                return
            await asyncio.sleep(0.01)

    task = asyncio.create_task(ticker())
    await asyncio.sleep(0.05)
    try:
        await work()
    finally:
        done.set()
        await task
    return max(b - a for a, b in zip(ticks, ticks[1:]))


def test_an_async_sends_pause_check_runs_off_the_event_loop(led, monkeypatch):
    with ProviderEmulator(tpm=10**6, rpm=None, window_seconds=60, output_lengths=[5]) as emu:
        client = openai.AsyncOpenAI(base_url=emu.base_url, api_key="k", max_retries=0)

        async def main() -> float:
            async with gate(stage="s", estimate=100, lane="a", ledger=led) as g:
                began = _slowed(led, monkeypatch, "pause_state")

                async def call() -> None:
                    g.report(await client.chat.completions.create(**CALL))

                stall = await _longest_stall(call)
                assert began  # the guard read the lane's pause from the (slow) ledger before the send
                return stall

        stall = asyncio.run(main())
    assert stall < SLOW / 2


def test_an_async_sends_429_is_written_off_the_event_loop(led, monkeypatch):
    with ProviderEmulator(tpm=1_000, rpm=None, window_seconds=3.0, output_lengths=[5]) as emu:
        client = openai.AsyncOpenAI(base_url=emu.base_url, api_key="k", max_retries=0)

        async def main() -> float:
            async with gate(stage="s", estimate=100, lane="a", ledger=led):
                assert emu.spend_outside(1_000)  # another client on the key spends the whole tokens window
                began = _slowed(led, monkeypatch, "pause")

                raised: list[float] = []

                async def call() -> None:
                    with pytest.raises(openai.RateLimitError):
                        await client.chat.completions.create(**CALL)
                    raised.append(time.monotonic())

                stall = await _longest_stall(call)
                assert len(began) == 1 and began[0] < raised[0]  # the guard wrote the pause, before the SDK's error
                return stall

        stall = asyncio.run(main())
    assert [r.status for r in emu.records] == [429]
    assert led.paused_for("a") > 0  # paused for every worker
    assert stall < SLOW / 2
