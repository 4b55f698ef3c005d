"""A provider's pause, as a gate meets it: a 429 that ended the body closes the lane for every process, and
a lease granted before another worker's 429 waits for the reopen before its body sends; a mixin of
:class:`lane_plugin.gating.context.Gate`.

A lane reopens half-way: the pause says when the provider's window has room, not how much of it a client
outside the lane (a shared key) spends meanwhile, so the first gate of any process to pass after a pause
sends alone (the probe, claimed in the ledger: :meth:`Ledger.claim_probe`) and the lane's other gates, in
every process, hold until it returns: a success opens the lane (:meth:`Ledger.reopen`), a 429 pauses it
again. Without it every lease granted at the reopen sends at once, and all but the first arrive in the
window the first one's 429 closed; with a probe per process, one request per process does.
"""

from __future__ import annotations

import time
from typing import Any

from ..ledger import Lease, Ledger
from .ledgers import run_logger
from .ratelimits import headers_of, rate_limit_info, remaining_of

# How often a gate held behind this process's probe looks again (no database read), behind another
# process's (one read each time), and the longest a probe holds the lane (a probe that hangs must not stall
# it: its holders then send as before).
PROBE_POLL = 0.02
PROBE_POLL_LEDGER = 0.05
PROBE_HOLD = 10.0
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
    _probe: tuple[tuple[int, str], float, float] | None = None  # (key, the pause's end, the claim's hold end)

    def _paused_for(self, led: Ledger) -> float:
        """Seconds to wait before the body (0.0: send now), read at the last moment before it: a lease granted
        before another worker's 429 paused the lane waits for the reopen, its lease renewed meanwhile, instead
        of sending into the closed window. This process's memory of the pause first (no database round trip:
        a 429 met here is known before its ledger write commits), else the ledger's row (another process's),
        which also says whether the pause ended with no request through since (the probe's turn)."""
        assert self.lease is not None
        lane = self.lease.lane
        left = led.paused_here(lane)
        if left <= 0 and self._probe_out(led, lane):
            left = PROBE_POLL  # this process's probe is out: nothing to read until it returns
        if left <= 0:
            try:
                left, ended, probe_left = led.pause_state(lane)
            except Exception as exc:  # noqa: BLE001 - the body runs as it would have without the check
                run_logger().warning("lane gate: could not read lane %s's pause: %s", lane, exc)
                return 0.0
            if left > 0:  # another process's pause
                led.remember_pause(lane, left)
            elif (here := led.paused_here(lane)) > 0:  # a 429 met in this process while the read was out
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
            hold_until = led.claim_probe(lane, ended, PROBE_HOLD)
        except Exception as exc:  # noqa: BLE001 - send as before the probe rule
            run_logger().warning("lane gate: could not claim lane %s's probe: %s", lane, exc)
            hold_until = None
            self._unclaim(key)
            return 0.0
        if hold_until is None:  # another process's probe, or the lane reopened or paused again: look again
            self._unclaim(key)
            return PROBE_POLL
        self._probe = (key, ended, hold_until)
        return 0.0

    def _unclaim(self, key: tuple[int, str]) -> None:
        if _probes.get(key, (None,))[0] is self:
            _probes.pop(key, None)

    def _probe_done(self, led: Ledger, exc: BaseException | None) -> None:
        """The probe returned: the lane is open for every process unless it met a 429 (:meth:`_heard_provider`
        paused it again, in memory first); either way its holders look again."""
        probe, self._probe = self._probe, None
        if probe is None:
            return
        if exc is None or rate_limit_info(exc) is None:
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
        try:
            led.give_back_probe(probe[0][1], probe[1], probe[2])
        except Exception as exc:  # noqa: BLE001 - the claim's hold runs out and the lane opens then
            run_logger().warning("lane gate: could not give back lane %s's probe: %s", probe[0][1], exc)

    def _resent(self, led: Ledger) -> None:
        """After waiting out a pause, the request goes out now: its charges count from now."""
        if self._waited_pause and self.lease is not None:
            try:
                led.sent_now(self.lease.job_id, self.lease.attempt)
            except Exception as exc:  # noqa: BLE001 - the charge stays at its pick-up (earlier: optimistic by the wait)
                run_logger().warning("lane gate: job %s's charges not moved to its send: %s", self.job_id, exc)

    def _heard_provider(self, led: Ledger, exc: BaseException) -> None:
        """A provider's rate-limit error ended the body: close the lane until the provider's reset, for every
        process (:meth:`Ledger.pause`); the attempt then bills what was reported (nothing for a rejected
        request), and Prefect's retry waits for the lane to reopen like any admission."""
        said = rate_limit_info(exc)
        if said is None:
            return
        lane = self.lease.lane if self.lease is not None else self.lane
        try:
            until = led.pause(
                lane, said.seconds, reason=f"a 429 on job {self.job_id} ({self.stage}): {said.what}", job_id=self.job_id
            )
        except Exception as pause_error:  # never let the pause hide the body's own error
            run_logger().warning("lane gate: could not pause lane %s after a 429: %s", lane, pause_error)
            return
        run_logger().warning(
            "lane gate: %s job %s met the provider's rate limit (%s): lane %s paused for %.3gs "
            "(until %s) for every worker",
            self.stage,
            self.job_id,
            said.what,
            lane,
            said.seconds,
            time.strftime("%H:%M:%S", time.gmtime(until)),
        )
        self._true_up(led, lane, exc)

    def _true_up(self, led: Ledger, lane: str, exc: BaseException) -> None:
        """The 429 carries the provider's own count (``x-ratelimit-limit-*`` less ``-remaining-*``): the lane's
        windows hold at least that from now (:meth:`Ledger.provider_used`), so it reopens knowing the spend
        outside it that made the 429, instead of on a window it thinks has room and a burst of sends into it."""
        used = remaining_of(headers_of(exc))
        if not used:
            return
        try:
            led.provider_used(lane, used, job_id=self.job_id, refused=True)
        except Exception as error:  # noqa: BLE001 - the pause is written; the window stays as it was
            run_logger().warning("lane gate: lane %s not trued up to the provider's count after a 429: %s", lane, error)
