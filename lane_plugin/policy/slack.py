"""The quantile slack (rule 12, second form): the lane's p99 wait bounded against token-fifo's p99, not each wait.

Rule 12's pointwise form (:mod:`lane_plugin.policy.overtake`) keeps every job within ``1 + beta`` of
token-fifo's tokens; that costs the median, because a job that found a short queue holds everyone to its small
key. A quantile of the waits only needs the jobs *below* that quantile kept under it: a job whose token-fifo
wait is short may wait longer than token-fifo would, up to the quantile's slack, without moving the quantile.
This form changes only the keys; the budget (``passed``, the least key, the oldest first once it binds) and
its proof are rule 12's, unchanged.

**The rule.** The lane keeps ``Q``, a running estimate of the ``q``-quantile (0.99) of ``V``, the rate tokens
waiting at each arrival (:class:`BacklogQuantile`: a log-bucketed count of the ``V`` seen, read at the lower
edge of the quantile's bucket, 0 until :data:`QUANTILE_WARMUP` arrivals). A job J that finds ``V_J`` waiting,
when the estimate is ``Q_J``, gets the key (:func:`slack_key`)::

    key_J = max(floor((c - 1) V_J), floor(c Q_J) - V_J)          c = the slack, 1.3

**The bound** (*token time*). Rule 12's proof gives, for every job, ``T_J <= V_J + key_J`` (``T_J``: the rate
tokens admitted between J's arrival and its admission; token-fifo admits ``V_J``), so::

    T_J <= max(c V_J, c Q_J)                                                     (every job)

and for every ``x``: ``#{J : T_J > c x} <= #{J : V_J > x} + #{J : Q_J > x}`` (a job with ``T_J > c x`` has
``V_J > x`` or ``Q_J > x``). Take ``x = max(P, Q*)``, ``P`` the ``q``-quantile of ``V`` over the jobs measured (at
most a fraction ``1 - q`` of them above it: token-fifo's ``q``-quantile of tokens ahead) and ``Q*`` the largest
estimate any of their keys read: the second count is 0, so at most a fraction ``1 - q`` of the jobs have ``T_J > c
max(P, Q*)``. **The lane's** ``q``-**quantile of tokens ahead is at most** ``c max(P, Q*)``: **within** ``c``
**of token-fifo's whenever the estimate never exceeded token-fifo's own quantile** (``Q* <= P``), and within ``c
Q*`` otherwise, on any traffic, with any tenants and weights, whatever else holds jobs out (ceiling, slots,
limits). That is the estimate's whole error term, and it is measured: ``lane simulate --json`` reports ``Q* / P``
(``SimResult.slack_estimate_ratio``).

*The estimate.* The running one (cumulative, conservative: a bucket's lower edge, zero until
:data:`QUANTILE_WARMUP` arrivals) has ``Q* <= P`` whenever no prefix of the traffic is heavier in its tail than
the whole; it cannot be clairvoyant (a run whose busiest hour comes first can have ``Q* > P``). And it costs
the median where the backlog grows through the run: there the running p99 is the present backlog, so a job's
slack ``c Q_J - V_J`` is about ``(c - 1) V_J``, the pointwise budget again (the Azure code trace: p50 0.89x).
A *learned* estimate (``SimConfig.overtake_learned``: the p99 of ``V`` a lane refit from its last day, as it
refits the size classes) gives the slack the quantile really leaves, with ``Q* = Q``: the bound is ``c max(P,
Q)``, ``c`` x token-fifo's on a day no lighter in its tail than the day learned.

*The second bound* (``LaneSnapshot.since`` and ``.dues``, on with this form). Rule 12 bounds every ``O_K`` by
``passed``, counted from the *oldest* waiting job's arrival, against the least key; a job arriving at the peak
(``V_K`` near ``Q``, the least key ``(c - 1) V_K``) then holds every pass to it, though almost all of ``passed``
was admitted before it arrived. But ``O_K`` is also at most what left the queue since K arrived, ``left - L_K``
(``L_K``: the counter at its arrival). So a pass of rate ``r`` is also allowed while ``left`` plus what this tick
admitted plus ``r`` is at most the least *due* ``L_K + key_K`` of the waiting jobs (one more index head, the due
fixed at intake): then ``O_K + r <= key_K`` for every waiting K. Either test keeps ``O_K <= key_K`` for every
job, so rule 12's proof (``T_K <= V_K + key_K``) and everything above stand with the larger of the two
allowances; the lane turns oldest-first only when neither has room.

Which jobs it lets wait: a job that found ``V_J < Q_J`` (a short queue: most of them) may be passed by up to
``c Q_J - V_J`` rate tokens, the slack the quantile leaves it; a job in the tail (``V_J >= Q_J``) keeps the
pointwise ``(c - 1) V_J``. ``c - 1`` is the largest pointwise part the bound allows: ``T_J <= c V_J`` keeps
a job with ``V_J <= P`` within ``c P``. A job that arrives at an empty queue (``V_J = 0``) has a token-fifo wait
of at most a window and may wait ``c Q_J / mu``: not within ``c`` of its own FIFO wait, by design (it is below
the quantile either way).

*In seconds*, as rule 12's: on a lane bound by its rate (``mu = burst_tokens / window_seconds``, ``mu' =
(burst_tokens - R) / window_seconds`` with ``R`` the largest rate cost), ``wait(J) <= T_J / mu' + 2
window_seconds`` and token-fifo's wait is at least ``(V_J - burst_tokens) / mu``; so with ``Q* <= P`` the
lane's ``q``-quantile wait is at most ``c (mu / mu') (F_q + window_seconds) + 2 window_seconds``, ``F_q``
token-fifo's ``q``-quantile wait: ``c`` times it up to the largest rate cost's share of the burst and three
windows.

*What it costs, and why it is on by default* (c = 1.25, ``LANE_DEFAULTS["overtake_slack"]``). The ledger runs
this form charged per job, each waiting job's own count of what passed it (:mod:`lane_plugin.policy.perjob`, kept
per arrival epoch and per tenant by :mod:`lane_plugin.ledger.overtake`), with ``Q`` refit from the lane's last day
of arrivals (docs/admission.md, "In the ledger"). The running estimate costs the p50 where the backlog grows
through the run (Azure code trace 0.91x token-fifo's: the running p99 is the present backlog, so the keys are the
pointwise ones), so the ledger's rule binds nothing on its learning day (the lane's first day runs in the order
alone) and binds from the day after with ``Q`` learned. Measured with ``Q`` learned from a day like it
(``benchmarks/bench_targets.py``, p50 / p99 as multiples of token-fifo's): Azure 0.48 / 1.23, Mooncake 0.08 / 1.12,
as with the order alone on these two traces, with the bound now by construction on any other. Charged per
tenant, it leaves the fair merge's shares and service-gap bound as they are (weights 3:1: gaps 15.4k and 285k, as
off). A stage of a run under way is neither held nor charged (held, a budget-bound week of multi-stage runs
stalled: docs/admission.md).
"""

from __future__ import annotations

import math

# The running quantile's resolution: 8 buckets per doubling (a bucket's lower edge is within 9% of its top).
BUCKETS_PER_DOUBLING = 8
# Arrivals before the estimate is read: until then it is 0 and the keys are the pointwise c - 1.
QUANTILE_WARMUP = 200
# The slack over token-fifo's quantile, and the quantile (the targets' p99 within 1.3x).
QUANTILE_SLACK = 1.3
SLACK_QUANTILE = 0.99
# A key while Q is not learned (a lane's learning day): no room ever binds (no counter can add up to it).
UNBOUNDED = 1 << 60
# A lane learns Q from the arrivals of its last day (the size classes learn from the last 500 estimates), once the
# rule has been on that long.
LEARN_SECONDS = 86_400.0


def learned_q(waiting_rates: list[int], warmup: int = QUANTILE_WARMUP) -> int | None:
    """``Q`` as a lane learns it from its last day's arrivals (those of the :data:`LEARN_SECONDS` before it learns):
    the p99 of their ``V`` (the value at index ``min(n - 1, floor(0.99 n))`` of the ``n`` sorted, as the ledger's
    refit reads it), or None with fewer than ``warmup`` arrivals (the lane goes on learning).

    Example:
        >>> learned_q(list(range(1_000))), learned_q([5] * 10)
        (990, None)
    """
    n = len(waiting_rates)
    if n < max(1, warmup):
        return None
    return sorted(waiting_rates)[min(n - 1, int(SLACK_QUANTILE * n))]


def slack_key(waiting_rate: int, estimate: int, slack: float = QUANTILE_SLACK) -> int:
    """A job's key at its arrival: ``max(floor((slack - 1) V), floor(slack Q) - V)``.

    ``waiting_rate`` (``V``): the rate tokens waiting then (not its own); ``estimate`` (``Q``): the lane's running
    quantile of ``V`` then (:meth:`BacklogQuantile.value`).

    Example:
        >>> slack_key(1_000, 10_000), slack_key(20_000, 10_000), slack_key(0, 0)
        (12000, 6000, 0)
    """
    if waiting_rate < 0:
        raise ValueError(f"waiting_rate={waiting_rate!r} must be >= 0")
    if estimate < 0:
        raise ValueError(f"estimate={estimate!r} must be >= 0")
    if not slack >= 1:
        raise ValueError(f"slack={slack!r} must be >= 1")
    return max(int((slack - 1) * waiting_rate), int(slack * estimate) - waiting_rate)


class BacklogQuantile:
    """A running, conservative ``q``-quantile of the rate tokens waiting at arrivals (``V``).

    Every arrival's ``V`` counts in a bucket: 0 in bucket 0, else bucket ``1 + floor(BUCKETS_PER_DOUBLING *
    log2(V))``. :meth:`value` is the lower edge of the bucket holding the ``q``-quantile of the values counted,
    so at most that quantile; 0 until ``warmup`` values are counted.

    Example:
        >>> b = BacklogQuantile(0.5, warmup=3)
        >>> for v in (0, 100, 1_000): b.add(v)
        >>> b.value(), b.n
        (99, 3)
        >>> BacklogQuantile(0.99).value()   # before the warm-up: nothing to lean on
        0
    """

    __slots__ = ("counts", "n", "q", "warmup")

    def __init__(self, q: float = SLACK_QUANTILE, warmup: int = QUANTILE_WARMUP) -> None:
        if not 0 < q < 1:
            raise ValueError(f"q={q!r} must be in (0, 1)")
        if warmup < 0:
            raise ValueError(f"warmup={warmup!r} must be >= 0")
        self.q, self.warmup = q, warmup
        self.counts: dict[int, int] = {}
        self.n = 0

    @staticmethod
    def bucket(v: int) -> int:
        """The bucket of ``v`` (0 for 0)."""
        return 0 if v <= 0 else 1 + math.floor(BUCKETS_PER_DOUBLING * math.log2(v))

    @staticmethod
    def edge(b: int) -> int:
        """The least integer of bucket ``b`` (the estimate reads it: at most any value in the bucket)."""
        return 0 if b <= 0 else math.ceil(2 ** ((b - 1) / BUCKETS_PER_DOUBLING) - 1e-9)

    def add(self, v: int) -> None:
        """Count one arrival's ``V``."""
        if v < 0:
            raise ValueError(f"waiting_rate={v!r} must be >= 0")
        b = self.bucket(v)
        self.counts[b] = self.counts.get(b, 0) + 1
        self.n += 1

    def value(self) -> int:
        """The estimate: the lower edge of the bucket of the ``ceil(q n)``-th smallest value counted (0 in warm-up)."""
        if self.n < max(self.warmup, 1):
            return 0
        rank = math.ceil(self.q * self.n)
        seen = 0
        for b in sorted(self.counts):
            seen += self.counts[b]
            if seen >= rank:
                return self.edge(b)
        return self.edge(max(self.counts))  # unreachable: the counts sum to n >= rank
