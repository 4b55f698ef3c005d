"""Fair order by tokens across the tenants of one lane: the Virtual Token Counter (VTC).

Many flows and teams share one lane (one provider key, one budget). Each job belongs to one *tenant*
of its lane. A tenant ``t`` has a weight ``w_t >= 1`` (default 1) and a counter ``S_t``, its *weighted
service*: the tokens admitted for it divided by ``w_t``, trued up to the actuals at settlement
(``+ (actual - est) / w_t``). This is the Virtual Token Counter of Sheng et al., "Fairness in Serving
Large Language Models" (OSDI'24), in our unit, tokens.

The rule (admission rule 7, across tenants; :func:`fair_order`):

- the next job considered comes from the *backlogged* tenant (one with jobs waiting) with the least
  counter; within a tenant, today's order (:mod:`lane_plugin.policy.order`: size classes, the wait
  bound). In one tick the candidates are merged by *tags*: the ``i``-th candidate of tenant ``t`` in
  its own order gets ``S_t + (e_1 + ... + e_{i-1}) / w_t``, what ``S_t`` will be when its turn comes if
  the ones before it are admitted; ascending tags, ties by today's order. That is exactly "least
  counter next", one admission after another. A *due* job (whose place in today's order, ``prio``, is at
  or before now: a small job at once, a job above the size-class boundary once it has waited
  ``max_wait_seconds``) goes before the least-served tenant's head when that head is not due yet, but only
  while its own tenant's tag is within ``R`` of the least (``R`` the largest ``e / w`` among the heads): as
  in one queue, a young big job does not go before the small jobs of others, yet a backlog that has waited
  out its age bound does not shut out a tenant that just arrived (with due jobs first whatever the tags, a
  2,000-job backfill past ``max_wait_seconds`` kept an interactive run's jobs behind 200 of its own);
- a tenant that comes back from idle is lifted to the least counter among the tenants backlogged now
  (:func:`lift`; with none backlogged, to the largest counter of the lane): no credit is banked while
  idle, and a tenant that was served more before it went idle keeps its debt;
- work-conserving: the order only ranks the jobs; every other rule (the ceiling, headroom, the drift
  allowance, the finishing reserve: runs under way finish first whoever owns them, the sliding burst
  window, the head's shadow reservation) applies to each candidate as it did. A tenant alone gets the
  whole lane, and a job of one tenant that does not fit never keeps out a job of another that does
  but for its shadow reservation (rule 8), as between two jobs of one tenant.
- a tenant's *budget* (optional ``ceiling``, with its own ``period``): its ``spent`` plus the
  estimates of its leased jobs plus ``est`` stay at or under it (I1 per tenant); a job it keeps out
  holds no shadow and blocks no other tenant (:func:`tenant_room`). With no tenant period, a job the
  tenant's ``spent`` alone leaves no room for is parked, saying so.

**The service-gap bound.** Let ``f`` and ``g`` be backlogged with due jobs throughout an interval, every
job a tick considers in it fit when its turn came (no job passed over for room), and let ``U = max_j e_j / w_j``
over the jobs admitted (``e`` the estimate, ``w`` its tenant's weight; ``U <= E``, the largest estimate,
as ``w >= 1``). Counting in flight jobs at their estimate, ``|S_f - S_g| <= U`` after every admission
in the interval, if it held when it began (lifting makes it hold for a tenant that returns).

*Proof.* By induction over admissions. A job of ``f`` is admitted only when its tag is the least,
i.e. ``S_f <= S_g``; afterwards ``S_f' = S_f + e / w_f <= S_g + U`` and ``S_g - S_f' <= S_g - S_f <=
U``. (A due job passing a head that is not due yet is admitted with ``S_f <= S_g + R``, ``R <= U``: then
``S_f' <= S_g + 2U``, so when not every head is due the bound is ``2U`` where it reads ``U`` below.) Admissions of a third tenant change neither. Settlement moves ``S_f`` by ``(a - e) / w_f``, at
most ``o / w_f`` up (``o`` the job's overrun, ``a - e``) and at most ``e / w_f`` down, so with ``L``
jobs of ``f`` in flight, trued up at any time, ``|S_f - S_g| <= U + L * O`` with ``O`` the largest
overrun. With ``L <= 2`` leases per tenant in flight (or no overrun) this is ``<= 2 (E + O)``: the
figure tests/policy check on random traffic (hypothesis). Over any span both are backlogged, the
tokens served therefore split as the weights within ``2 (U + L O)`` tokens of weighted service, so the
shares of ``n`` admissions converge to ``w_f / (w_f + w_g)`` as ``n`` grows.

**The wait bound.** Within a tenant, the order is today's: a job is never passed by a job of its own
tenant that arrived after its priority, and its wait bound (:mod:`lane_plugin.policy.order`) holds
with the lane's throughput replaced by its tenant's share of it. While ``k`` tenants are backlogged,
the tenant ``t`` of a job J gets, over any span, at least ``w_t / W`` (``W`` the sum of the backlogged
weights) of the tokens admitted, less ``(k - 1) (U + L O) w_t`` (the gap bound): the jobs ahead of J
in its tenant's order are admitted within the time the lane takes to serve ``W / w_t`` times their
tokens plus ``(k - 1) W (U + L O)``. A tenant alone (one tenant, or one backlogged) is served in
today's order exactly: its waits, and the lane's p99, are today's.

**A returning tenant's run.** Let ``f`` return from idle with ``k`` jobs of estimate ``e`` and weight ``w``
while ``g`` alone is backlogged with jobs of ``e'`` and weight ``w'``, none due. Lifted to ``S_g``, the
``j``-th job of ``f`` has tag ``S_g + (j - 1) e / w``, and ``g``'s jobs ``S_g, S_g + e' / w', ...`` (ties
to ``g``): the ``k``-th job of ``f`` is the ``k + 1 + floor((k - 1) (e / w) / (e' / w'))``-th admission.
Equal sizes and ``w' = 1``: ``k + 1 + floor((k - 1) / w)``, against ``k`` if ``f`` went first every time
(weight 1: 10 admissions for 5 jobs; weight 4: 7). On a lane whose limit admits ``r`` tokens a second
while full, no order obeying it admits the run in less than ``k e / r``.

**With the overtaking budget** (rule 12, :mod:`lane_plugin.policy.overtake`): the budget applies to every
admission whatever its tenant, so the service-gap bound holds over any span in which it does not bind (no
candidate kept out by it); while it binds the oldest jobs go first (their admissions still charge their
tenant's counter, so a tenant served out of turn pays it back afterwards), and every job's wait stays within
``1 + beta`` of token-fifo's in tokens whatever the tenants' weights: the lane's p99 with several tenants is
bounded as with one.

Pure functions: no database, no clock.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Set
from dataclasses import dataclass
from heapq import heappop, heappush

from .candidate import Candidate

# The tenant of a job submitted without one and outside any flow run.
DEFAULT_TENANT = "default"
# Tenant weights: a share when backlogged, relative to the others (1: the default).
MIN_WEIGHT, MAX_WEIGHT = 1.0, 1000.0


@dataclass(frozen=True)
class TenantState:
    """One tenant of a lane as admission sees it.

    ``served``: its weighted service (the Virtual Token Counter); ``spent``: what it settled in its
    period; ``reserved``: the estimates of its leased jobs; ``ceiling``: its budget (None: none);
    ``resets``: whether its budget has a period (a job its ``spent`` leaves no room for waits for the
    reset rather than being parked).

    Example:
        >>> TenantState(weight=4.0, ceiling=1_000, spent=600, reserved=300).room
        100
    """

    weight: float = 1.0
    served: float = 0.0
    ceiling: int | None = None
    spent: int = 0
    reserved: int = 0
    resets: bool = False

    @property
    def room(self) -> int | None:
        """What its budget leaves for new admissions (None: no budget)."""
        return None if self.ceiling is None else self.ceiling - self.spent - self.reserved


UNKNOWN_TENANT = TenantState()
# A tenant's head in the fair merge: (its tag, the head's place in its tenant's own order, the tenant).
_Head = tuple[float, tuple[float, str], str]


def fair_order(
    tenants: Mapping[str, TenantState],
    candidates: Iterable[Candidate],
    within: Callable[[Candidate], tuple[float, str]],
    now: float | None = None,
) -> list[Candidate]:
    """The candidates in fair order: merged by tags, each tenant's in its own order (``within``'s key).

    With ``now``, the *due* candidates (place in the order ``<= now``: a small job at once, a job above the
    size-class boundary once it has waited ``max_wait_seconds``) come before the others, each set merged by
    tags: a young big job of the least-served tenant does not go before the small jobs of the others (as in
    one queue, where it is behind every small job for ``max_wait_seconds``).
    A tenant absent from ``tenants`` has weight 1 and counter 0 (the ledger gives every tenant a row).

    Example:
        >>> key = lambda c: (c.waiting_since, c.id)
        >>> cs = [Candidate(f"b{i}", 100, float(i), tenant="backfill") for i in range(4)]
        >>> cs += [Candidate("i0", 100, 9.0, tenant="interactive")]
        >>> ts = {"backfill": TenantState(served=1_000.0), "interactive": TenantState(served=1_000.0)}
        >>> [c.id for c in fair_order(ts, cs, key)]
        ['b0', 'i0', 'b1', 'b2', 'b3']
        >>> ts = {"backfill": TenantState(served=1_000.0), "interactive": TenantState(weight=4.0, served=0.0)}
        >>> [c.id for c in fair_order(ts, cs, key)]
        ['i0', 'b0', 'b1', 'b2', 'b3']
    """
    groups: dict[str, list[Candidate]] = {}
    for c in candidates:
        groups.setdefault(c.tenant, []).append(c)
    if len(groups) <= 1:
        return sorted(next(iter(groups.values()), []), key=within)
    queues: dict[str, list[Candidate]] = {}
    tags: dict[str, float] = {}
    weights: dict[str, float] = {}
    for name, group in groups.items():
        group.sort(key=within, reverse=True)  # popped from the end: its own order
        queues[name] = group
        state = tenants.get(name, UNKNOWN_TENANT)
        tags[name], weights[name] = state.served, state.weight
    # A due head may go before the least-served tenant's head that is not due yet only while its own tag is
    # within one head's weighted size of the least (``reach``): small jobs are not kept behind a young big job,
    # and a backlog that has waited out its age bound does not shut a tenant that just arrived out.
    reach = max(c.est / weights[c.tenant] for group in groups.values() for c in group)
    # Each tenant's head as (tag, its place in its own order, tenant), in a heap of all heads and one of the due
    # heads, an entry stale once its tenant's head or tag moved on (dropped when it surfaces): O(log) a pick, not a
    # scan of every tenant's head (100 tenants of 40 waiting jobs each: 85 ms a tick on SQLite so, 25 by heaps).
    heads: list[_Head] = []
    due: list[_Head] = []
    current: dict[str, _Head] = {}

    def push(name: str) -> None:
        head = current[name] = (tags[name], within(queues[name][-1]), name)
        heappush(heads, head)
        if now is not None and head[1][0] <= now:
            heappush(due, head)

    def top(heap: list[_Head]) -> _Head | None:
        while heap and current.get(heap[0][2]) is not heap[0]:
            heappop(heap)
        return heap[0] if heap else None

    for name in queues:
        push(name)
    out: list[Candidate] = []
    while queues:
        least = top(heads)
        assert least is not None
        pick = least[2]
        if now is not None and least[1][0] > now:
            # the due head with the least (tag, place), if its tag is within reach: no other due head's is
            first_due = top(due)
            if first_due is not None and first_due[0] <= least[0] + reach:
                pick = first_due[2]
        queue = queues[pick]
        c = queue.pop()
        out.append(c)
        tags[pick] += c.est / weights[pick]
        if queue:
            push(pick)
        else:
            del queues[pick], current[pick]
    return out


def lift(served: Mapping[str, float], was_backlogged: Set[str], backlogged: Set[str]) -> dict[str, float]:
    """The counters of the tenants coming back from idle, lifted (only those that change).

    ``served``: every tenant of the lane's counter; ``was_backlogged``: the tenants admission saw
    backlogged last; ``backlogged``: those with jobs waiting now. A returning tenant's counter becomes
    at least the least counter among the tenants still backlogged (none: the largest of the lane), so
    idle time earns no credit.

    Example:
        >>> lift({"a": 500.0, "b": 100.0, "c": 900.0}, {"a", "c"}, {"a", "b", "c"})
        {'b': 500.0}
        >>> lift({"a": 500.0, "b": 100.0}, set(), {"b"})   # nobody backlogged: the lane's largest
        {'b': 500.0}
    """
    returning = backlogged - was_backlogged
    if not returning:
        return {}
    staying = backlogged & was_backlogged
    floor = min(served[t] for t in staying) if staying else max(served.values(), default=0.0)
    return {t: floor for t in sorted(returning) if served.get(t, 0.0) < floor}


def tenant_room(state: TenantState, admitted: int, est: int) -> bool:
    """Does a job of ``est`` tokens fit its tenant's budget, with ``admitted`` tokens leased for it this tick?

    Example:
        >>> tenant_room(TenantState(ceiling=1_000, spent=500), 300, 200), tenant_room(TenantState(), 0, 10**9)
        (True, True)
    """
    return state.ceiling is None or state.spent + state.reserved + admitted + est <= state.ceiling


def tenant_unfit_reason(name: str, state: TenantState, est: int) -> str | None:
    """Why a job can never fit its tenant's budget before the tenant's next reset, or None.

    Example:
        >>> tenant_unfit_reason("nightly", TenantState(ceiling=1_000, spent=900), 200)
        "estimate 200 exceeds what is left of the ceiling of tenant 'nightly': 100 of 1000 (spent 900)"
    """
    if state.ceiling is None or state.spent + est <= state.ceiling:
        return None
    left = state.ceiling - state.spent
    return (
        f"estimate {est} exceeds what is left of the ceiling of tenant {name!r}: {left} of {state.ceiling} "
        f"(spent {state.spent})"
    )


NO_RESET_HELPS = "no reset makes room for it"


def tenant_never_fits(name: str, state: TenantState, est: int) -> str | None:
    """Why a job can never fit its tenant's budget, whatever its period resets (its estimate alone exceeds the
    ceiling), or None. Such a job once waited for a reset that could never make room for it.

    Example:
        >>> tenant_never_fits("nightly", TenantState(ceiling=500, resets=True), 1_000)
        "estimate 1000 exceeds the whole ceiling of tenant 'nightly' (500): no reset makes room for it"
    """
    if state.ceiling is None or est <= state.ceiling:
        return None
    return f"estimate {est} exceeds the whole ceiling of tenant {name!r} ({state.ceiling}): {NO_RESET_HELPS}"
