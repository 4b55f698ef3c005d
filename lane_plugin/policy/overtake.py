"""The overtaking budget (admission rule 12): every wait bounded against token-fifo's, by construction.

The order of rule 7 (small jobs first, the size classes, the fair merge of tenants) lets a job be passed
by later, smaller or better-placed jobs for up to ``max_wait_seconds``, whatever first come, first served
would have done. This rule bounds it relative to token-fifo, in tokens, whatever the traffic.

**The rule.** The lane keeps one counter, ``overtaken`` (``Omega``): the rate tokens of every job admitted
while an older job was waiting (an *out-of-order* admission; the oldest waiting job's admission does not
count). *Older* is the order jobs entered the queue (the ledger: ``(wait_since, id)``). A job J entering
the queue when ``V`` rate tokens wait there (J excluded) gets the key (:func:`overtake_key`)::

    K_J = Omega(at its arrival) + floor(beta * V)

and an out-of-order admission of a job X is allowed only if ``Omega + rate(X) <= K_J`` for every job J
waiting but X (the least key waiting: the head of an index). The oldest waiting job is always allowed
(it passes nobody). ``beta`` is :data:`OVERTAKE_BETA`. Nothing else changes: the candidates are read in
rule 7's order and a job the budget keeps out is skipped (it holds no shadow: rule 8's head is the first
job the budget allows that does not fit).

**The bound** (*token time*). Let J enter the queue when ``V`` rate tokens wait. Token-fifo admits exactly
those ``V`` tokens (less any parked) before J. Under this rule, the jobs admitted between J's arrival and
its admission are (a) older than J: among the ``V`` tokens waiting when it arrived, so at most ``V``; and
(b) younger than J: each admitted while J, older, was waiting, so out of order and counted in ``Omega``,
each allowed only with ``Omega + rate <= K_J``, so together at most ``K_J - Omega(at J's arrival) =
floor(beta V)``. **So at most** ``(1 + beta) V`` **rate tokens are ever admitted ahead of J: within**
``1 + beta`` **of token-fifo's, for every job, on any traffic, with any tenants and weights.** It holds
whatever else keeps jobs out (ceiling, lease slots, limits): it counts tokens, not seconds. It is not
vacuous: J is admitted (liveness) because once ``Omega`` reaches the least key, only the oldest waiting
job may go, so the lane runs first come, first served until the jobs holding the least keys are
admitted; J is among them in turn.

*In seconds.* On a lane bound by its rate (``mu = burst_tokens / window_seconds`` tokens a second while
anything waits) token-fifo's wait is ``F = V / mu`` and the window passes at least ``mu' = (burst_tokens -
R) / window_seconds`` while a head waits for room (``R`` the largest rate cost: rule 8's shadow holds at most
that back), so ``wait(J) <= (1 + beta) V / mu' + 2 window_seconds`` (one window for where the window stood
when J arrived, one for the last head's room): every quantile with it,
``p99 <= (1 + beta) (mu / mu') p99_fifo`` plus two windows. With ``beta = 0.25`` and a largest rate cost
of at most 4% of the burst that is ``1.3`` x token-fifo's p99, on any traffic.

**What it costs the order.** Out-of-order admissions can take at most ``beta / (1 + beta)`` of what a
backlogged lane admits over the life of a job (the rest goes to the oldest jobs, in arrival order), so
the jobs that gain are the smallest ``beta / (1 + beta)`` of the tokens (20% at 0.25): on traffic whose
small jobs are a small share of its tokens (most LLM traffic: many short calls, a few long ones) they
still skip the queue; the big ones wait at most ``beta`` more than first come, first served. A job that
arrives at an empty queue (``V = 0``) is passed by nobody.

**With tenants.** The fair merge orders the candidates; the budget applies to every admission, whatever
its tenant. The service-gap bound (:mod:`lane_plugin.policy.fairness`) holds over any span in which the
budget does not bind (no job skipped); while it binds the lane serves its oldest jobs first, whatever
their tenant (their admissions still charge their tenant's counter, so a tenant served out of turn pays
it back afterwards), and every wait stays within ``1 + beta`` of token-fifo's.

tests/policy/test_overtake.py checks the token bound for every job on random traffic with tenants
(hypothesis).
"""

from __future__ import annotations

from collections.abc import Sequence

from .candidate import Candidate

# The overtaking budget's slack over token-fifo (rule 12): at most ``(1 + OVERTAKE_BETA) V`` rate tokens are
# admitted ahead of a job that found ``V`` waiting. 0.25: within 1.3x in seconds with rate costs up to 4% of
# the burst (the module's bound), a margin of the bound, not of any trace.
OVERTAKE_BETA = 0.25


def overtake_key(overtaken: int, waiting_rate: int, beta: float = OVERTAKE_BETA) -> int:
    """A job's overtaking key at its arrival: ``overtaken + floor(beta * waiting_rate)``.

    ``overtaken``: the lane's counter of out-of-order rate tokens then; ``waiting_rate``: the rate tokens
    waiting in the lane then (not its own). An integer, so the ledger stores and indexes it exactly.

    Example:
        >>> overtake_key(1_000, 40_000), overtake_key(1_000, 0), overtake_key(0, 3, 0.5)
        (11000, 1000, 1)
    """
    if waiting_rate < 0 or overtaken < 0:
        raise ValueError(f"overtaken={overtaken!r} and waiting_rate={waiting_rate!r} must be >= 0")
    return overtaken + int(beta * waiting_rate)


class Overtaking:
    """The budget inside one admission tick: which candidates it allows, and what they add to the counter.

    ``overtaken``: the lane's counter; ``guard``: the least keys of the waiting jobs, ``(key, id)`` ascending
    (the first few: the keys past them are no smaller than the last one read); ``oldest``: the ids of the
    waiting jobs in arrival order (the first few). An empty ``guard``: the rule is off (everything allowed).

    Example:
        >>> o = Overtaking(0, ((500, "old"), (9_000, "small")), ("old", "small"))
        >>> o.allows(Candidate("small", 400, 5.0)), o.allows(Candidate("big", 600, 5.0))
        (True, False)
        >>> o.admitted(Candidate("small", 400, 5.0)); o.overtook, o.allows(Candidate("mid", 200, 5.0))
        (400, False)
        >>> o.allows(Candidate("old", 9_000, 0.0))   # the oldest passes nobody
        True
    """

    __slots__ = ("_done", "_i", "base", "guard", "oldest", "on", "overtook")

    def __init__(self, overtaken: int, guard: Sequence[tuple[int, str]], oldest: Sequence[str]) -> None:
        self.base, self.guard, self.oldest = overtaken, guard, oldest
        self.on = bool(guard)
        self.overtook = 0  # the rate tokens this tick admits out of order
        self._i = 0  # oldest[_i]: the oldest job still waiting (as far as the list reaches)
        self._done: set[str] = set()

    def in_order(self, c: Candidate) -> bool:
        """Whether ``c`` is the oldest waiting job (a job past the list read counts as out of order)."""
        return self._i < len(self.oldest) and self.oldest[self._i] == c.id

    def limit(self, cid: str) -> int:
        """The least key of the jobs still waiting but ``cid`` (a lower bound past the keys read)."""
        done = self._done
        for key, jid in self.guard:
            if jid != cid and jid not in done:
                return key
        return self.guard[-1][0]

    def allows(self, c: Candidate) -> bool:
        """Whether the budget lets ``c`` be admitted now."""
        if not self.on or self.in_order(c):
            return True
        return self.base + self.overtook + c.rate <= self.limit(c.id)

    def admitted(self, c: Candidate) -> None:
        """``c`` is admitted: out of order, its rate tokens count."""
        if self.on and not self.in_order(c):
            self.overtook += c.rate
        self.left(c)

    def left(self, c: Candidate) -> None:
        """``c`` stops waiting (admitted or parked): its key no longer binds."""
        if not self.on:
            return
        self._done.add(c.id)
        oldest, done = self.oldest, self._done
        while self._i < len(oldest) and oldest[self._i] in done:
            self._i += 1
