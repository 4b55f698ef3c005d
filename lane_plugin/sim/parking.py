"""Jobs that leave the simulated lane unserved: a lease the worker did not start in time expires (the job
waits again, or is parked after ``max_attempts`` leases), and a job still waiting past its deadline is parked
(the tail); a mixin of :class:`lane_plugin.sim.engine.Sim`."""

from __future__ import annotations

from heapq import heappop

from .chains import PARKED, WAITING, WAKE_EV


class Parking:
    """The expiries and the tail of :class:`lane_plugin.sim.engine.Sim`."""

    def park(self, j: int, t: float) -> None:
        """A waiting job leaves the queue for the tail (past its deadline, or a policy parks it)."""
        self.n_waiting -= 1
        if self.lane_queue is not None:
            self.lane_queue.left(j)
        if self.tenants is not None:
            self.tenants.leave(j)
        self._park(j, t)

    def _park(self, j: int, t: float) -> None:
        self.state[j] = PARKED
        self.parked += 1
        self.parked_at[j] = t
        if self.record:
            self.log.append(("park", t, self.job_id(j)))

    def _expire(self, j: int, t: float) -> None:
        self.leased -= 1
        self.reserved -= self.est[j]
        self.reserved_var -= self.var[j]
        self.expired += 1
        if self.record:
            self.log.append(("expire", t, self.job_id(j)))
        if self.lease_no[j] >= self.cfg.max_attempts:
            self._park(j, t)
        else:
            self._make_waiting(j)

    def _park_overdue(self, t: float) -> None:
        deadline = self.cfg.deadline
        age, state = self.age, self.state
        while age:
            since, j = age[0]
            if state[j] != WAITING:
                heappop(age)
                continue
            if since + deadline > t:
                if since + deadline != self._next_deadline_wake:
                    self._next_deadline_wake = since + deadline
                    self._push(since + deadline, WAKE_EV)
                break
            heappop(age)
            self.park(j, t)
