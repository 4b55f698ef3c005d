"""The simulation's slow worker: it takes leased jobs in lease order, sleeps when the drainer is cold, and
wakes the loop when it can start again; a mixin of :class:`lane_plugin.sim.engine.Sim`."""

from __future__ import annotations

from .chains import DONE_EV, LEASED, RUNNING, WAKE_EV
from .config import SimConfig
from .traffic import Trace


def service_times(trace: Trace, cfg: SimConfig) -> list[float]:
    """Seconds the worker spends on each job: base + per output token, else per actual token."""
    base, per_out, per_tok = cfg.service_base, cfg.service_per_output_token, cfg.service_per_token
    return [base + (per_tok * a if o is None else per_out * o) for a, o in zip(trace.actual, trace.output_tokens)]


class SlowWorker:
    """The worker side of :class:`lane_plugin.sim.engine.Sim`."""

    def _wake_worker_at(self, t: float) -> None:
        wake = (t // self.cfg.sleep_every + 1) * self.cfg.sleep_every
        if wake != self._next_worker_wake:
            self._next_worker_wake = wake
            self._push(wake, WAKE_EV)

    def _start_work(self, t: float) -> None:
        queue, state, lease_no = self.queue, self.state, self.lease_no
        while self.free > 0 and queue:
            if self.asleep(t):
                self._wake_worker_at(t)
                return
            j, no = queue.popleft()
            if state[j] != LEASED or lease_no[j] != no:
                continue  # the lease expired before the worker got to it
            state[j] = RUNNING
            if self.started_at[j] < 0:
                self.started_at[j] = t
            end = t + self.service[j]
            self.busy += max(0.0, min(end, self.horizon) - max(t, self.t0))
            self.free -= 1
            self._push(end, DONE_EV, j)
