"""Jobs and runs in the simulator: the state codes, which stage follows which, what finished.

A *run* is the jobs sharing a ``run_key`` (a pipeline item's stages); a job
without a ``run_key`` is a single call, a run of one. With chaining on, the
first stage of a run arrives at its recorded time and stage k+1 is submitted
when stage k settles: a stage that is parked or refused breaks its run, and
the stages after it are never submitted.
"""

from __future__ import annotations

from dataclasses import dataclass

from .traffic import Trace

# Job states (a bytearray per policy run).
WAITING, LEASED, RUNNING, DONE, PARKED, FUTURE, REFUSED = range(7)
# The simulation's events, by kind (its heap of (time, seq, kind, job, lease_no)).
DONE_EV, EXPIRE_EV, WAKE_EV, PERIOD_EV = range(4)


@dataclass
class Runs:
    """Which run each job belongs to and which stage follows it.

    Example:
        >>> tr = Trace()
        >>> for t, rk in [(0, "a"), (1, None), (2, "a"), (3, "b"), (4, "a")]:
        ...     tr.add(t, "s", 10, 10, rk)
        >>> r = Runs.of(tr, chain=True)
        >>> r.static, r.next_stage, r.size
        ([0, 1, 3], [2, -1, 4, -1, -1], [3, 1, 1])
        >>> Runs.of(tr, chain=False).static
        [0, 1, 2, 3, 4]
    """

    run_of: list[int]
    size: list[int]
    next_stage: list[int]
    static: list[int]

    @classmethod
    def of(cls, trace: Trace, *, chain: bool) -> Runs:
        """Number the runs of ``trace`` (in order of first arrival) and chain their stages."""
        index: dict[str, int] = {}
        run_of: list[int] = []
        size: list[int] = []
        last: list[int] = []
        next_stage = [-1] * len(trace)
        static: list[int] = []
        for j, rk in enumerate(trace.run_key):
            r = index.get(rk, -1) if rk is not None else -1
            if r < 0:
                r = len(size)
                if rk is not None:
                    index[rk] = r
                size.append(0)
                last.append(-1)
            run_of.append(r)
            size[r] += 1
            if chain and last[r] >= 0:
                next_stage[last[r]] = j
            else:
                static.append(j)
            last[r] = j
        return cls(run_of, size, next_stage, static)

    def figures(self, state: bytearray, admitted_at: list[float], actual: list[int]) -> dict:
        """Runs started (a stage admitted) and finished (every stage done), and tokens stranded.

        ``stranded_tokens``: tokens settled for runs that did not finish (a
        stage parked, refused, never submitted, or still pending at the end):
        spent on work that delivered nothing.
        """
        n_runs = len(self.size)
        done = [0] * n_runs
        started = bytearray(n_runs)
        settled = [0] * n_runs
        run_of = self.run_of
        for j, s in enumerate(state):
            r = run_of[j]
            if admitted_at[j] >= 0:
                started[r] = 1
            if s == DONE:
                done[r] += 1
                settled[r] += actual[j]
        finished = [done[r] == self.size[r] for r in range(n_runs)]
        return {
            "runs": n_runs,
            "runs_started": sum(started),
            "runs_finished": sum(finished),
            "stranded_tokens": sum(settled[r] for r in range(n_runs) if not finished[r]),
        }


__all__ = ["DONE", "FUTURE", "LEASED", "PARKED", "REFUSED", "RUNNING", "Runs", "WAITING"]
