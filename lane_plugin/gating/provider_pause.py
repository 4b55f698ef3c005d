"""A provider's pause, as a gate meets it: a 429 that ended the body closes the lane for every process, and
a lease granted before another worker's 429 waits for the reopen before its body sends; a mixin of
:class:`lane_plugin.gating.context.Gate`.

A lane reopens half-way: the pause says when the provider's window has room, not how much of it a client
outside the lane (a shared key) spends meanwhile, so the first gate to pass after a pause this process knew of
sends alone (the probe) and the lane's other gates in this process hold until it returns: a success opens the
lane, a 429 pauses it again. Without it every lease granted at the reopen sends at once, and all but the
first arrive in the window the first one's 429 closed.
"""

from __future__ import annotations

import time
from typing import Any

from ..ledger import Lease, Ledger
from .ledgers import run_logger
from .ratelimits import headers_of, rate_limit_info, remaining_of

# How often a gate held behind a probe looks again, and the longest it holds (a probe that hangs must not
# stall the lane: its holders then send as before).
PROBE_POLL = 0.02
PROBE_HOLD = 10.0
# (id(ledger), lane) -> (the probing gate, when its hold ends); single dict operations only, no lock: a
# timeout raised into a thread at any bytecode never leaves one held.
_probes: dict[tuple[int, str], tuple[Any, float]] = {}


class ProviderPause:
    """The provider-pause side of :class:`~lane_plugin.gating.context.Gate`."""

    stage: str
    lane: str
    job_id: str | None
    lease: Lease | None
    _waited_pause: bool
    _probe: tuple[tuple[int, str], float] | None = None

    def _paused_for(self, led: Ledger) -> float:
        """Seconds to wait before the body (0.0: send now), read at the last moment before it: a lease granted
        before another worker's 429 paused the lane waits for the reopen, its lease renewed meanwhile, instead
        of sending into the closed window. This process's memory of the pause first (no database round trip:
        a 429 met here is known before its ledger write commits), else the ledger's row (another process's)."""
        assert self.lease is not None
        lane = self.lease.lane
        left = led.paused_here(lane)
        if left <= 0 and self._probe_out(led, lane):
            left = PROBE_POLL  # another gate's probe is out: nothing to read until it returns
        if left <= 0:
            try:
                left = led.paused_for(lane)
            except Exception as exc:  # noqa: BLE001 - the body runs as it would have without the check
                run_logger().warning("lane gate: could not read lane %s's pause: %s", lane, exc)
                return 0.0
            if left > 0:  # another process's pause: this one reopens half-way too
                led.remember_pause(lane, left)
            else:  # a 429 met in this process while the read was out (measured: it happens)
                left = led.paused_here(lane)
        if left <= 0:
            left = self._behind_probe(led, lane)
        if left > 0:
            if not self._waited_pause:
                run_logger().info("lane gate: %s job %s waits for lane %s to reopen after a provider's 429",
                                  self.stage, self.job_id, lane)  # fmt: skip
            self._waited_pause = True
        return left

    def _probe_out(self, led: Ledger, lane: str) -> bool:
        claim = _probes.get((id(led), lane))
        return claim is not None and claim[0] is not self and time.time() <= claim[1]

    def _behind_probe(self, led: Ledger, lane: str) -> float:
        """After a pause ended: 0.0 for the gate that sends first (the probe), a short wait for the others
        until it returns (:meth:`_probe_done`) or :data:`PROBE_HOLD` passes."""
        ended = led.pause_ended(lane)
        if ended is None:
            return 0.0
        key = (id(led), lane)
        claim = _probes.setdefault(key, (self, time.time() + PROBE_HOLD))
        if claim[0] is self:
            self._probe = (key, ended)
            return 0.0
        if time.time() > claim[1]:  # the probe hangs: the lane opens, as before the probe rule
            led.reopened(lane, ended)
            if _probes.get(key) is claim:
                _probes.pop(key, None)
            return 0.0
        return PROBE_POLL

    def _probe_done(self, led: Ledger, exc: BaseException | None) -> None:
        """The probe returned: the lane is open unless it met a 429 (:meth:`_heard_provider` paused it again,
        in memory first); either way its holders look again."""
        probe = self._probe
        if probe is None:
            return
        if exc is None or rate_limit_info(exc) is None:
            led.reopened(probe[0][1], probe[1])
        self._drop_probe()

    def _drop_probe(self) -> None:
        """Give up the probe without a word on the lane (its body never ran): the next gate probes."""
        probe, self._probe = self._probe, None
        if probe is not None and _probes.get(probe[0], (None,))[0] is self:
            _probes.pop(probe[0], None)

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
            until = led.pause(lane, said.seconds, reason=f"a 429 on job {self.job_id} ({self.stage}): {said.what}",
                              job_id=self.job_id)  # fmt: skip
        except Exception as pause_error:  # never let the pause hide the body's own error
            run_logger().warning("lane gate: could not pause lane %s after a 429: %s", lane, pause_error)
            return
        run_logger().warning("lane gate: %s job %s met the provider's rate limit (%s): lane %s paused for %.3gs "
                             "(until %s) for every worker", self.stage, self.job_id, said.what, lane, said.seconds,
                             time.strftime("%H:%M:%S", time.gmtime(until)))  # fmt: skip
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
