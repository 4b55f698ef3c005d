"""A provider's pause, as a gate meets it: a 429 that ended the body closes the lane for every process, and
a lease granted before another worker's 429 waits for the reopen before its body sends; a mixin of
:class:`lane_plugin.gating.context.Gate`."""

from __future__ import annotations

import time

from ..ledger import Lease, Ledger
from .ledgers import run_logger
from .ratelimits import headers_of, rate_limit_info, remaining_of


class ProviderPause:
    """The provider-pause side of :class:`~lane_plugin.gating.context.Gate`."""

    stage: str
    lane: str
    job_id: str | None
    lease: Lease | None
    _waited_pause: bool

    def _paused_for(self, led: Ledger) -> float:
        """Seconds the provider's pause still closes the lane (0.0: open), read at the last moment before the
        body: a lease granted before another worker's 429 paused the lane waits for the reopen, its lease
        renewed meanwhile, instead of sending into the closed window."""
        assert self.lease is not None
        try:
            left = led.paused_for(self.lease.lane)
        except Exception as exc:  # noqa: BLE001 - the body runs as it would have without the check
            run_logger().warning("lane gate: could not read lane %s's pause: %s", self.lease.lane, exc)
            return 0.0
        if left > 0:
            self._waited_pause = True
            run_logger().info("lane gate: %s job %s waits %.3gs for lane %s to reopen after a provider's 429",
                              self.stage, self.job_id, left, self.lease.lane)  # fmt: skip
        return left

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
