"""This process's memory of a provider's pause yields to the ledger (issue 24): a reopen written by another
process ends a wait here within one step, not when the 429 heard here said.

A process remembers the pause of a 429 it heard (before its ledger write commits: its own workers stop at
once). Once the ledger holds it, the ledger's word wins: another process's probe that reopens the lane ends
the wait of a request held by ``track_limits``' request hook (outside a gate) or by a gate
(:meth:`ProviderPause._paused_for`) within :data:`PAUSE_STEP`, where before it slept out the whole pause
it remembered. While the ledger still says paused, the provider's word heard here holds.
"""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import httpx
import pytest

from lane_plugin import Ledger, track_limits
from lane_plugin.gating.provider_pause import ProviderPause
from lane_plugin.gating.ratelimits import PAUSE_STEP

pytestmark = pytest.mark.timeout(120)
RETRY_AFTER = 600.0  # the provider's word on the 429: far longer than any wait the test allows
QUICK = PAUSE_STEP + 5.0  # one step, and a loaded machine's read and thread start (vs RETRY_AFTER before)


@pytest.fixture
def two(ledger_url):
    """This process's ledger and another process's handle on the same database (its own memory)."""
    here, other = Ledger(ledger_url), Ledger(ledger_url)
    here.set_lane("m", allowance=10**6, ceiling=10**6)
    yield here, other
    here.close()
    other.close()


def _reopen_elsewhere(other: Ledger) -> None:
    """What another process's probe writes when its request went through: the lane opens for every process."""
    ended = other.lane("m").paused_until
    assert ended is not None and other.reopen("m", ended)


def test_a_reopen_by_another_process_ends_track_limits_wait_within_a_step(two):
    here, other = two
    arrived: list[float] = []

    def provider(request: httpx.Request) -> httpx.Response:
        arrived.append(time.monotonic())
        if len(arrived) == 1:
            return httpx.Response(429, headers={"retry-after": f"{RETRY_AFTER:g}"})
        return httpx.Response(200, json={})

    client = track_limits(httpx.Client(transport=httpx.MockTransport(provider)), lane="m", ledger=here)
    assert client.get("http://provider/v1").status_code == 429
    # the pause was remembered here (the provider's minute) and written for every process
    assert here.paused_here("m") > RETRY_AFTER / 2 and here.paused_for("m") > RETRY_AFTER / 2
    assert other.pause_state("m")[0] > RETRY_AFTER / 2 and other.paused_here("m") == 0.0

    done: list[int] = []
    sender = threading.Thread(target=lambda: done.append(client.get("http://provider/v1").status_code), daemon=True)
    sender.start()
    time.sleep(2 * PAUSE_STEP + 0.3)
    assert len(arrived) == 1 and sender.is_alive()  # held by the request hook: the lane is paused
    reopened = time.monotonic()
    _reopen_elsewhere(other)
    sender.join(60)
    assert done == [200] and len(arrived) == 2
    assert arrived[1] - reopened < QUICK, f"sent {arrived[1] - reopened:.2f}s after the reopen"
    assert here.paused_for("m") == 0.0  # open here too, with the memory of the 429 still unexpired
    assert here.paused_here("m") > RETRY_AFTER / 2


class _Gate(ProviderPause):
    def __init__(self, led: Ledger):
        job = led.submit("s", 1, "m", key="g")
        self.stage, self.lane, self.job_id = "s", "m", job
        self.lease = SimpleNamespace(lane="m", job_id=job, attempt=1)
        self._waited_pause = False
        self._ledger_arg = led


def test_a_reopen_by_another_process_ends_a_gates_hold_within_a_step(two):
    here, other = two
    g = _Gate(here)
    g._heard_response(httpx.Response(429, headers={"retry-after": f"{RETRY_AFTER:g}"}))  # the send guard's 429
    assert here.paused_here("m") > RETRY_AFTER / 2 and g._paused_for(here) > RETRY_AFTER / 2
    held: list[float] = []
    holder = threading.Thread(target=lambda: (g._hold_send(), held.append(time.monotonic())), daemon=True)
    holder.start()
    time.sleep(2 * PAUSE_STEP + 0.3)
    assert held == [] and holder.is_alive()  # the body's next request waits for the reopen
    reopened = time.monotonic()
    _reopen_elsewhere(other)
    holder.join(60)
    assert held and held[0] - reopened < QUICK, f"sent {held[0] - reopened:.2f}s after the reopen"


def test_the_providers_word_heard_here_holds_while_the_ledger_says_paused(two):
    here, other = two
    here.pause("m", RETRY_AFTER, reason="a 429 heard here")
    # the ledger's pause ends sooner than the provider's word heard here (as if another process wrote it)
    other._run(lambda cur, now: cur.execute("update lane set paused_until = :u where name = 'm'", {"u": now + 3.0}))
    assert here.paused_for("m") > RETRY_AFTER / 2  # still paused in the ledger: the longer word holds
    while other.pause_state("m")[0] > 0:
        time.sleep(0.05)
    assert here.paused_for("m") == 0.0  # the ledger's pause ended: its word wins over the memory
    assert here.paused_here("m") > RETRY_AFTER / 2


def test_a_429_heard_here_holds_before_its_ledger_write_commits(two):
    here, other = two
    here.remember_pause("m", RETRY_AFTER)  # as the send guard does before the write
    assert other.pause_state("m") == (0.0, None, None)  # the ledger has not heard of it
    assert here.paused_for("m") > RETRY_AFTER / 2  # held all the same: the write is out
