"""The send guard's hold (:meth:`ProviderPause._hold_send`) leaves nothing held after an exception raised at any
line it runs (issue 22's rule: Prefect raises a sync task's timeout into the task's thread at any bytecode).

A request of a gated body that meets a lane paused by a provider's 429 waits in :meth:`_hold_send` (reading the
pause, in steps), and the first one after the pause ended claims the probe, in this process and in the ledger.
Here each run starts while the lane is paused by another process, its one wait ends the pause (the same lines
every run: one wait, then the claim), and an exception is raised into the thread at the ``k``-th line run in
the hold's modules (provider_pause.py, the ledger's limits_api.py), for every ``k`` an uninterrupted hold runs. After each the test proves the exception was raised, then asserts the
hold left nothing held: the call returned, the gate holds no probe, this process has no claim of it, the ledger
has no probe out and the lane was not reopened (nothing went through), and the next gate is the probe at once.
"""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest

from lane_plugin import Ledger
from lane_plugin.gating import provider_pause
from lane_plugin.gating.provider_pause import ProviderPause
from lane_plugin.ledger import limits_api

from .conftest import figure
from .injection import Injector, in_files, run_injected

pytestmark = pytest.mark.timeout(600)
FILES = (provider_pause.__file__, limits_api.__file__)
PAUSE = 60.0  # another process's pause, in force as the hold starts; its wait ends it (_ending_wait)


class _Gate(ProviderPause):
    def __init__(self, led: Ledger, key: str):
        job = led.submit("s", 1, "l", key=key)
        self.stage, self.lane, self.job_id = "s", "l", job
        self.lease = SimpleNamespace(lane="l", job_id=job, attempt=1)
        self._waited_pause = False
        self._ledger_arg = led


def _hold(g: _Gate, at: int) -> dict:
    """``g._hold_send()`` in a new thread with :class:`Injected` raised at traced line ``at``."""
    out: dict = {"raised": False}

    def run() -> None:
        inj = Injector(at, in_files(*FILES), where="function")
        out["raised"] = run_injected(g._hold_send, inj) == "raised"
        out["seen"], out["at"] = inj.seen, inj.fired_at

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(30)
    out["returned"] = not t.is_alive()
    return out


def _held(led: Ledger, g: _Gate) -> list[str]:
    """What the interrupted hold left held (empty: nothing)."""
    left = []
    if g._probe is not None:
        left.append(f"the gate holds a probe {g._probe}")
    if any(claim[0] is g for claim in list(provider_pause._probes.values())):
        left.append("this process's probe claim")
    paused, ended, probe_left = led.pause_state("l")
    if probe_left is not None:
        left.append(f"the ledger's probe claim ({probe_left:.1f}s left)")
    if paused <= 0 and ended is None:
        left.append("the lane reopened with nothing through")
    return left


def _pause(other: Ledger) -> None:
    other.pause("l", PAUSE, reason="a 429 in another process")  # a new pause: any claim of the last one is gone


def _ending_wait(other: Ledger):
    """The hold's sleep: the pause ends meanwhile (as if its time had passed), so the next read finds the probe's
    turn."""

    def end(cur, now):
        cur.execute("update lane set paused_until = :u where name = 'l'", {"u": now - 0.001})

    return SimpleNamespace(time=time.time, sleep=lambda _seconds: other._run(end))


@pytest.mark.parametrize("ledger_url", ["sqlite", "postgresql"], indirect=True)
def test_an_exception_at_any_line_of_the_hold_leaves_nothing_held(ledger_url, monkeypatch):
    led, other = Ledger(ledger_url), Ledger(ledger_url)  # the hold's process, and another's
    led.set_lane("l", allowance=10**9, ceiling=10**9)
    monkeypatch.setattr(provider_pause, "time", _ending_wait(other))
    try:
        _pause(other)
        first = _Gate(led, "whole")
        whole = _hold(first, 10**9)
        assert whole["returned"] and not whole["raised"]
        lines = whole["seen"]
        assert lines >= 20, whole  # the hold's own lines: reads, a wait, the claim
        assert first._waited_pause and first._probe is not None  # it waited, then claimed the probe
        assert led.pause_state("l")[2] is not None
        first._drop_probe(led)
        fired, left_held, later = [], [], []
        for at in range(1, lines + 1):
            _pause(other)
            g = _Gate(led, f"g{at}")
            out = _hold(g, at)
            assert out["returned"], f"the hold interrupted at line {at} ({out['at']}) never returned"
            if out["raised"]:
                fired.append(out["at"])
                if what := _held(led, g):
                    left_held.append((at, out["at"], what))
                other._run(lambda cur, now: cur.execute("update lane set paused_until = :u", {"u": now - 0.001}))
                nxt = _Gate(led, f"next{at}")
                # The next gate becomes the probe: at once on a quiet machine; a CI run at load saw 18 of 130 points
                # need another look (what it saw is printed). Held would mean PROBE_HOLD (10 s): 2 s tells them apart.
                deadline, looks = time.monotonic() + 2.0, []
                while (wait := nxt._paused_for(led)) != 0.0 or nxt._probe is None:
                    looks.append((round(wait, 3), led.pause_state("l"), provider_pause._probes.get((id(led), "l"))))
                    if time.monotonic() > deadline:
                        left_held.append((at, out["at"], f"the next gate was not the probe within 2 s: {looks[-3:]}"))
                        break
                    time.sleep(0.02)
                if looks:
                    later.append((at, out["at"], len(looks), looks[0]))
                nxt._drop_probe(led)
            else:
                g._drop_probe(led)  # the line ran after the hold returned: it holds the probe, as it should
        where = sorted(set(fired))
        figure(f"send guard hold ({led.db.dialect}): {lines} lines, {len(fired)} injection points fired")
        print(f"send guard hold: {lines} lines, {len(fired)} injection points fired at {where}")
        print(f"the next gate was the probe only after another look at {len(later)} points: {later}")
        assert left_held == [], f"held after an exception at these lines: {left_held}"
        assert len(fired) >= lines - 1, (len(fired), lines)  # the faults happened (the last may land after the call)
        assert any(w.startswith("_behind_probe") for w in where)  # including between the claims
    finally:
        led.close()
        other.close()
