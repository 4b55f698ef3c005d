"""A provider's pause, as a gate meets it: a 429 that ended the body closes the lane for every process, and
a lease granted before another worker's 429 waits for the reopen before its body sends; a mixin of
:class:`lane_plugin.gating.context.Gate`.

A lane reopens half-way: the pause says when the provider's window has room, not how much of it a client
outside the lane (a shared key) spends meanwhile, so the first gate of any process to pass after a pause
sends alone (the probe, claimed in the ledger: :meth:`Ledger.claim_probe`) and the lane's other gates, in
every process, hold until it returns: a success opens the lane (:meth:`Ledger.reopen`), a 429 pauses it
again. Without it every lease granted at the reopen sends at once, and all but the first arrive in the
window the first one's 429 closed; with a probe per process, one request per process does.

The send guard (:mod:`lane_plugin.gating.send_guard`) makes the same checks at every request the body sends
over httpx (:meth:`ProviderPause._hold_send`) and hears its 429 before the SDK does
(:meth:`ProviderPause._heard_response`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from typing import Any

from ..ledger import Lease, Ledger
from . import provider_requests, send_guard
from .ledgers import get_ledger, run_logger
from .ratelimits import (
    DEFAULT_PAUSE,
    MAX_PAUSE,
    PAUSE_STEP,
    headers_of,
    rate_limit_info,
    remaining_of,
    wait_from_headers,
)

# How often a gate held behind this process's probe looks again (no database read), behind another
# process's (one read each time), and the longest a probe holds the lane (a probe that hangs must not stall
# it: its holders then send as before).
PROBE_POLL = 0.02
PROBE_POLL_LEDGER = 0.05
PROBE_HOLD = 10.0
# A request the body sends later than this after its lease's pick-up has its charges counted from its send (one
# ledger write, once per gate): the lane dated them at the pick-up (plus the send slack), and a request that
# leaves later (a loaded machine, a body that works before it calls) would have the lane's window let them go
# before the provider's does (RPM-bound, single runs: 4 x 429 without it; 3 and 0 with it, the load 17 and 4-13).
LATE_SEND = 0.1
# (id(ledger), lane) -> (this process's probing gate, when its hold ends): its other gates wait without a
# database read, and only one of them claims in the ledger. Single dict operations only, no lock: a timeout
# raised into a thread at any bytecode never leaves one held past its hold (the ledger's claim arbitrates).
_probes: dict[tuple[int, str], tuple[Any, float]] = {}


class ProviderPause:
    """The provider-pause side of :class:`~lane_plugin.gating.context.Gate`."""

    stage: str
    lane: str
    job_id: str | None
    lease: Lease | None
    _waited_pause: bool
    _ledger_arg: Any
    _probe: tuple[tuple[int, str], float, float | None] | None = None  # (key, the pause's end, the claim's hold end)
    _picked_at: float | None = None  # when the lease was picked up, or its charges last re-dated (time.time())
    _late_done = False  # a late send re-dated the charges (once per gate)

    def _paused_for(self, led: Ledger) -> float:
        """Seconds to wait before the body (0.0: send now), read at the last moment before it: a lease granted
        before another worker's 429 paused the lane waits for the reopen, its lease renewed meanwhile, instead
        of sending into the closed window. A 429 met here whose ledger write has not committed first (no database
        round trip), else the ledger's row, whose word wins over this process's memory of a pause it holds (a
        reopen written by any process ends the wait; a waiter sleeps :data:`PAUSE_STEP` at most between reads),
        and which also says whether the pause ended with no request through since (the probe's turn)."""
        assert self.lease is not None
        if self._picked_at is None:  # the first call, right after the pick-up
            self._picked_at = time.time()
        send_guard.install()  # the first gate to reach its body installs the guard of its sends (once)
        lane = self.lease.lane
        left = led.paused_unheard(lane)  # a 429 met here whose write has not committed: nothing to read yet
        if left <= 0 and self._probe_out(led, lane):
            left = PROBE_POLL  # this process's probe is out: nothing to read until it returns
        if left <= 0:
            known = led.pauses_here(lane)
            try:
                left, ended, probe_left = led.pause_state(lane)
            except Exception as exc:  # noqa: BLE001 - the body runs as it would have without the check
                run_logger().warning("lane gate: could not read lane %s's pause: %s", lane, exc)
                return 0.0
            if left > 0:  # paused for every process: the longer word, the ledger's or the one heard here
                left = max(left, led.paused_here(lane))
            elif (here := led.paused_unheard(lane, known)) > 0:  # a 429 met in this process while the read was out
                left = here
            elif ended is not None:
                left = self._behind_probe(led, lane, ended, probe_left)
        if left > 0:
            if not self._waited_pause:
                run_logger().info(
                    "lane gate: %s job %s waits for lane %s to reopen after a provider's 429",
                    self.stage,
                    self.job_id,
                    lane,
                )
            self._waited_pause = True
        return left

    def _probe_out(self, led: Ledger, lane: str) -> bool:
        claim = _probes.get((id(led), lane))
        return claim is not None and claim[0] is not self and time.time() <= claim[1]

    def _behind_probe(self, led: Ledger, lane: str, ended: float, probe_left: float | None) -> float:
        """The pause that ended at ``ended`` (ledger time) has had no request through: 0.0 for the gate that
        claims the probe, a short wait for the others until it returns (:meth:`_probe_done`) or its hold runs
        out (then the lane opens, as before the probe rule)."""
        if probe_left is not None:
            if probe_left > 0:  # another process's probe is out (or this one's, seen before its claim here)
                return min(PROBE_POLL_LEDGER, probe_left)
            try:  # its hold ran out: the probe hangs, the lane opens
                led.reopen(lane, ended)
            except Exception as exc:  # noqa: BLE001 - send as before the probe rule
                run_logger().warning("lane gate: could not reopen lane %s after a hung probe: %s", lane, exc)
            return 0.0
        key = (id(led), lane)
        claim = _probes.get(key)
        if claim is None or claim[0] is self or time.time() > claim[1]:
            _probes[key] = (self, time.time() + PROBE_HOLD)
        if _probes.get(key, (None,))[0] is not self:
            return PROBE_POLL  # another gate of this process is claiming
        try:
            # One statement: a claim the ledger committed is the gate's to give back from the line after it (an
            # exception raised into the thread lands at a line, or at the end of the call before the store: then
            # the claim's hold runs out, as a hung probe's does).
            self._probe = (key, ended, led.claim_probe(lane, ended, PROBE_HOLD))
        except Exception as exc:  # noqa: BLE001 - send as before the probe rule
            run_logger().warning("lane gate: could not claim lane %s's probe: %s", lane, exc)
            self._unclaim(key)
            return 0.0
        if self._probe[2] is None:  # another process's probe, or the lane reopened or paused again: look again
            self._probe = None
            self._unclaim(key)
            return PROBE_POLL
        return 0.0

    def _unclaim(self, key: tuple[int, str]) -> None:
        # Taken first, put back if it was another gate's: interrupted in between, another gate's claim is lost
        # (the ledger's claim still arbitrates); read first, this gate's would stay and hold the others.
        claim = _probes.pop(key, None)
        if claim is not None and claim[0] is not self:
            _probes.setdefault(key, claim)

    def _probe_done(self, led: Ledger, exc: BaseException | None) -> None:
        """The probe returned: the lane is open for every process unless it met a 429 (:meth:`_heard_provider`
        paused it again, in memory first); either way its holders look again."""
        probe, self._probe = self._probe, None
        if probe is None:
            return
        met_429 = (
            exc is not None
            and rate_limit_info(exc) is not None
            and provider_requests.error_is_providers(probe[0][1], exc)
        )
        if probe[2] is not None and not met_429:  # (probe[2] None: its claim was refused)
            try:
                led.reopen(probe[0][1], probe[1])
            except Exception as error:  # noqa: BLE001 - the claim's hold runs out and the lane opens then
                run_logger().warning("lane gate: could not reopen lane %s after its probe: %s", probe[0][1], error)
        self._unclaim(probe[0])

    def _drop_probe(self, led: Ledger) -> None:
        """Give up the probe without a word on the lane (its body never ran): the next gate probes."""
        probe, self._probe = self._probe, None
        if probe is None:
            return
        self._unclaim(probe[0])
        if probe[2] is None:  # the claim was refused (interrupted before the gate looked): nothing to give back
            return
        try:
            led.give_back_probe(probe[0][1], probe[1], probe[2])
        except Exception as exc:  # noqa: BLE001 - the claim's hold runs out and the lane opens then
            run_logger().warning("lane gate: could not give back lane %s's probe: %s", probe[0][1], exc)

    def _resent(self, led: Ledger) -> None:
        """As the body begins: after waiting out a pause, the request goes out now: its charges count from now."""
        if self._waited_pause:
            self._count_from_now(led)

    def _count_from_now(self, led: Ledger) -> None:
        if self.lease is None:
            return
        self._picked_at = time.time()
        try:
            led.sent_now(self.lease.job_id, self.lease.attempt)
        except Exception as exc:  # noqa: BLE001 - the charge stays at its pick-up (earlier: optimistic by the wait)
            run_logger().warning("lane gate: job %s's charges not moved to its send: %s", self.job_id, exc)

    def _heard_provider(self, led: Ledger, exc: BaseException) -> None:
        """A provider's rate-limit error ended the body: close the lane until the provider's reset, for every
        process (:meth:`Ledger.pause`); the attempt then bills what was reported (nothing for a rejected
        request), and Prefect's retry waits for the lane to reopen like any admission. A 429 the send guard
        already heard (:meth:`_heard_response`) has paused the lane: not again."""
        said = rate_limit_info(exc)
        if said is None or send_guard.heard_for(getattr(exc, "response", None)) is not None:
            return
        lane = self.lease.lane if self.lease is not None else self.lane
        if not provider_requests.error_is_providers(lane, exc):
            run_logger().info(
                "lane gate: %s job %s ended in a 429 not from the provider (%s): lane %s not paused",
                self.stage,
                self.job_id,
                said.what,
                lane,
            )
            return
        try:
            until = led.pause(
                lane, said.seconds, reason=f"a 429 on job {self.job_id} ({self.stage}): {said.what}", job_id=self.job_id
            )
        except Exception as pause_error:  # never let the pause hide the body's own error
            run_logger().warning("lane gate: could not pause lane %s after a 429: %s", lane, pause_error)
            return
        self._said_paused(lane, said.what, said.seconds, until)
        self._true_up(led, lane, headers_of(exc))

    def _said_paused(self, lane: str, what: str, seconds: float, until: float) -> None:
        run_logger().warning(
            "lane gate: %s job %s met the provider's rate limit (%s): lane %s paused for %.3gs (until %s) for every "
            "worker",
            self.stage,
            self.job_id,
            what,
            lane,
            seconds,
            time.strftime("%H:%M:%S", time.gmtime(until)),
        )

    # -- the send guard (send_guard.py): each request the body sends over httpx --------------------------
    def _hold_send(self) -> None:
        """Before a request of the body leaves: wait while the lane is paused or another gate's probe is out
        (:meth:`_paused_for`); the probe itself goes."""
        if self._probe is not None:
            return
        led = get_ledger(self._ledger_arg)
        try:
            waited = False
            while (left := self._paused_for(led)) > 0:
                waited = True
                time.sleep(min(left, PAUSE_STEP))
            self._sent_late(led, waited)
        except BaseException:  # a timeout raised into the wait: the request never leaves
            self._let_go(led)
            raise

    def _let_go(self, led: Ledger) -> None:
        """A hold that ended in an exception (its request never sent) leaves nothing held: a probe it claimed goes
        back to the next gate (not reopening the lane: nothing went through), and its claim in this process
        too."""
        self._drop_probe(led)
        if self.lease is not None:
            self._unclaim((id(led), self.lease.lane))

    def _sent_late(self, led: Ledger, waited: bool) -> None:
        """The request leaves now: after a wait, or the first time it is more than :data:`LATE_SEND` after the
        lease's pick-up, the attempt's charges count from now."""
        late = not self._late_done and self._picked_at is not None and time.time() - self._picked_at > LATE_SEND
        if waited or late:
            self._late_done = True
            self._count_from_now(led)

    async def _ahold_send(self) -> None:
        """:meth:`_hold_send` for an async client: each check (a ledger read, a write when the send is late) in a
        thread, the event loop's other tasks running meanwhile; the wait itself on the loop."""
        if self._probe is not None:
            return
        led = get_ledger(self._ledger_arg)
        try:
            waited = False
            while (left := await asyncio.to_thread(self._check_send, led, waited)) > 0:
                waited = True
                await asyncio.sleep(min(left, PAUSE_STEP))
        except BaseException:  # cancelled while waiting: the request never leaves
            # (a check still running in its thread when the cancellation came may claim the probe after this:
            # that claim's hold runs out, as a hung probe's does)
            self._let_go(led)
            raise

    def _check_send(self, led: Ledger, waited: bool) -> float:
        """One check of :meth:`_ahold_send`: seconds to wait yet, or 0.0 with the send's charges dated."""
        left = self._paused_for(led)
        if left <= 0:
            self._sent_late(led, waited)
        return left

    def _heard_response(self, response: Any) -> None:
        """A request of the body has its answer, the SDK not yet: a 429 pauses the lane (this process's memory
        at once, then the ledger) and is marked so the SDK's error does not pause it again; any other answer to
        this gate's probe reopens the lane. Never fails the request: the lane's bookkeeping is no reason to."""
        try:
            led = get_ledger(self._ledger_arg)
            if getattr(response, "status_code", None) != 429:
                if self._probe is not None:
                    self._probe_done(led, None)
                return
            assert self.lease is not None
            lane = self.lease.lane
            headers = {str(k).lower(): str(v) for k, v in response.headers.items()}
            said = wait_from_headers(headers)
            seconds = min(max(said[0] if said else DEFAULT_PAUSE, 0.001), MAX_PAUSE)
            what = f"HTTP 429 ({said[1]} {headers.get(said[1], '')})" if said else "HTTP 429 (no reset header)"
            led.remember_pause(lane, seconds)  # this process's other gates hold from now, before the write commits
            setattr(response, send_guard.HEARD, lane)
            probe, self._probe = self._probe, None
            if probe is not None:  # the probe met the limit again: the new pause holds the lane
                self._unclaim(probe[0])
            reason = f"a 429 on job {self.job_id} ({self.stage}): {what}"
            until = led.pause(lane, seconds, reason=reason, job_id=self.job_id)
        except Exception as exc:  # noqa: BLE001 - the request's answer goes back to the SDK all the same
            run_logger().warning("lane send guard: job %s's answer not heard: %s", self.job_id, exc)
            return
        self._said_paused(lane, what, seconds, until)
        self._true_up(led, lane, headers)

    def _true_up(self, led: Ledger, lane: str, headers: Mapping[str, str]) -> None:
        """The 429 carries the provider's own count (``x-ratelimit-limit-*`` less ``-remaining-*``): the lane's
        windows hold at least that from now (:meth:`Ledger.provider_used`), so it reopens knowing the spend
        outside it that made the 429, instead of on a window it thinks has room and a burst of sends into it."""
        used = remaining_of(headers)
        if not used:
            return
        try:
            led.provider_used(lane, used, job_id=self.job_id, refused=True)
        except Exception as error:  # noqa: BLE001 - the pause is written; the window stays as it was
            run_logger().warning("lane gate: lane %s not trued up to the provider's count after a 429: %s", lane, error)
