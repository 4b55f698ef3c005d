"""The overtaking budget (rule 12, lane_plugin.policy.overtake): waits bounded against token-fifo's, in tokens.

A rate-bound lane (ample budget and lease slots, a sliding window of ``burst`` rate tokens per ``window``
seconds) admits each second what :func:`admit` chooses (the very code the ledger runs) from random arrivals
of random sizes in up to three tenants of random weights, the lane keeping the budget's counters (tokens
waiting, tokens that left) and each job's key and position as the module says. The bound its docstring proves, checked for every job J: the rate tokens
admitted between J's arrival and its admission are at most ``V_J + floor(beta V_J)``, ``V_J`` the rate
tokens waiting when J arrived (token-fifo admits exactly ``V_J`` ahead of it).
"""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from lane_plugin.policy import Candidate, LanePolicy, LaneSnapshot, admit
from lane_plugin.policy.fairness import TenantState
from lane_plugin.policy.overtake import Overtaking, overtake_key
from lane_plugin.policy.rules import OVERTAKE

WINDOW = 10.0


def _jobs(rng: random.Random, burst: int, n: int, load: float):
    """(arrival second, est, tenant): mean demand ``load`` x the window's rate, small and big jobs mixed."""
    mean = burst / WINDOW * load
    jobs, t = [], 0
    while len(jobs) < n:
        for _ in range(rng.randint(0, 3)):
            est = rng.choice([rng.randint(10, burst // 20), rng.randint(burst // 4, burst // 2)])
            jobs.append((t, est, rng.choice("abc")))
        t += max(1, round(rng.expovariate(mean / max(1, burst // 6))))
    return jobs[:n]


class _Rooms:
    """Each waiting job's room (key - what passed it) by arrival position, kept one by one (policy.perjob.Rooms):
    per tenant, as the ledger keeps them (an admission lowers the rooms of its own tenant's older jobs)."""

    def __init__(self) -> None:
        self.room: dict[int, int] = {}
        self.of: dict[int, str] = {}  # position -> tenant (default: "default")

    def position(self, job_id: str) -> int | None:
        p = int(job_id[1:])
        return p if p in self.room else None

    def tenant(self, job_id: str) -> str:
        return self.of.get(int(job_id[1:]), "default")

    def least(self, lo: int, hi: int, tenant: str = "default") -> int | None:
        rooms = [r for p, r in self.room.items() if lo <= p < hi and self.of.get(p, "default") == tenant]
        return min(rooms) if rooms else None

    def admitted(self, job_id: str, rate: int) -> None:
        p = int(job_id[1:])
        del self.room[p]
        mine = self.of.get(p, "default")
        for q in self.room:
            if q < p and self.of.get(q, "default") == mine:
                self.room[q] -= rate


def _run(
    jobs,
    burst: int,
    beta: float | None,
    seed: int = 0,
    guard_reads: int = 6,
    keyer=None,
    dues=False,
    exact=False,
    either=False,
    own: dict | None = None,
):
    """Admit every second; returns, per job, V at arrival and the rate tokens admitted ahead of it.

    ``keyer``: a job's key from V at its arrival (rule 12's quantile form, tests/policy/test_slack.py) instead of
    ``overtake_key(V, beta)``; ``dues``: the snapshot gives the slack's second bound too (``since``, ``dues``);
    ``exact``: each job's own room instead of the heads (rule 12's per-job form, tests/policy/test_perjob.py);
    ``either`` (with ``dues``): the guard's rows carry their dues, each job within either of its allowances.
    ``own``: filled with each job's ``(V, tokens ahead)`` counted within its own tenant (what per-job rooms bound)."""
    on = beta is not None or keyer is not None
    rng = random.Random(seed)
    policy = LanePolicy(
        ceiling=10**12, burst_tokens=burst, window_seconds=WINDOW, max_leased=10**6, max_wait_seconds=600.0
    )
    weights = {"a": 1.0, "b": float(rng.randint(1, 4)), "c": 1.0}
    served = {t: 0.0 for t in weights}
    waiting: dict[str, Candidate] = {}
    keys: dict[str, int] = {}
    waiting_rate = left = admitted_total = 0
    pos: dict[str, int] = {}
    window: list[tuple[int, int]] = []
    v, start, ahead, due = {}, {}, {}, {}
    tenant_rate: dict[str, int] = {}  # rate tokens waiting, per tenant
    tenant_total: dict[str, int] = {}  # rate tokens admitted so far, per tenant
    own_start: dict[str, tuple[int, int]] = {}
    rooms = _Rooms() if exact else None
    i, now = 0, 0
    while len(ahead) < len(jobs):
        while i < len(jobs) and jobs[i][0] <= now:
            at, est, tenant = jobs[i]
            jid = f"j{i:05d}"
            v[jid], start[jid] = waiting_rate, admitted_total
            if on:
                keys[jid] = keyer(waiting_rate) if keyer is not None else overtake_key(waiting_rate, beta)
                pos[jid] = left + waiting_rate
                due[jid] = left + keys[jid]
                if rooms is not None:
                    rooms.room[i], rooms.of[i] = keys[jid], tenant
            waiting[jid] = Candidate(jid, est, float(at), tenant=tenant)
            own_start[jid] = (tenant_rate.get(tenant, 0), tenant_total.get(tenant, 0))
            tenant_rate[tenant] = tenant_rate.get(tenant, 0) + est
            waiting_rate += est
            i += 1
        window = [(s, r) for s, r in window if s > now - WINDOW]
        tenants = {t: TenantState(weight=w, served=served[t]) for t, w in weights.items()}
        guard = tuple(sorted((keys[j], j) for j in waiting))[:guard_reads] if on else ()
        oldest = tuple(sorted(waiting))[:3]
        passed = left - pos[oldest[0]] if on and oldest else 0
        snap = LaneSnapshot(
            policy,
            spent=0,
            reserved=0,
            leased=0,
            window_used=sum(r for _, r in window),
            now=float(now),
            tenants=tenants,
            passed=passed,
            guard=guard,
            oldest=oldest,
            since=left if dues else 0,
            dues=tuple(sorted((due[j], j) for j in waiting))[:guard_reads] if dues and on else (),
            rooms=rooms,
            guard_dues=tuple(due[j] for _, j in guard) if either else (),
        )
        decision = admit(snap, list(waiting.values()))
        for c in decision.admitted:
            del waiting[c.id]
            if rooms is not None:
                rooms.admitted(c.id, c.est)
            waiting_rate -= c.est
            left += c.est
            window.append((now, c.est))
            served[c.tenant] += c.est / weights[c.tenant]
            ahead[c.id] = admitted_total - start[c.id]
            admitted_total += c.est
            if own is not None:
                own[c.id] = (own_start[c.id][0], tenant_total.get(c.tenant, 0) - own_start[c.id][1])
            tenant_rate[c.tenant] -= c.est
            tenant_total[c.tenant] = tenant_total.get(c.tenant, 0) + c.est
        now += 1
    return v, ahead


@settings(max_examples=30, deadline=None)
@given(
    seed=st.integers(0, 2**32),
    beta=st.sampled_from([0.0, 0.1, 0.25, 0.5]),
    load=st.floats(0.6, 1.6),
    reads=st.integers(1, 8),
)
def test_no_job_has_more_than_1_plus_beta_times_token_fifos_tokens_admitted_ahead_of_it(seed, beta, load, reads):
    jobs = _jobs(random.Random(seed), 20_000, 150, load)
    v, ahead = _run(jobs, 20_000, beta, seed, guard_reads=reads)
    late = {j: (ahead[j], v[j]) for j in v if ahead[j] > v[j] + int(beta * v[j])}
    assert late == {}


def test_without_the_budget_a_big_job_is_passed_by_more_than_the_bound():
    """The bound is the rule's: a big job in a stream of small ones is passed far past it without the budget."""
    burst, beta = 20_000, 0.25
    jobs = [(0, 1_000, "a")] * 4 + [(0, 9_000, "a")] + [(0, 1_000, "a")] * 16
    jobs += [(t, 1_000, "b") for t in range(1, 300) for _ in range(2)]
    v, ahead = _run(jobs, burst, None)
    assert ahead["j00004"] > 10 * (v["j00004"] + int(beta * v["j00004"]))  # held by its size class
    v, ahead = _run(jobs, burst, beta)
    assert ahead["j00004"] <= v["j00004"] + int(beta * v["j00004"])


def test_the_oldest_job_passes_nobody_and_a_kept_out_job_holds_no_shadow():
    p = LanePolicy(ceiling=10**9, burst_tokens=1_000, window_seconds=10.0)
    big, small = Candidate("old", 900, 0.0), Candidate("new", 50, 1.0)
    snap = LaneSnapshot(
        p, 0, 0, 0, window_used=500, now=2.0, passed=100, guard=((120, "old"), (400, "new")), oldest=("old", "new")
    )
    d = admit(snap, [big, small])  # old does not fit the window; new would overtake it by 50 > 120 - 100
    assert d.ids == [] and d.head_reason is not None and d.shadow == big
    snap = LaneSnapshot(
        p, 0, 0, 0, window_used=0, now=2.0, passed=100, guard=((120, "old"), (400, "new")), oldest=("old", "new")
    )
    d = admit(snap, [big, small])  # the room fits both: old goes in order, new still may not pass it
    assert d.ids == ["old"] and d.overtook == 0
    snap = LaneSnapshot(
        p, 0, 0, 0, window_used=0, now=2.0, passed=100, guard=((160, "old"), (400, "new")), oldest=("old", "new")
    )
    d = admit(snap, [big, small])  # 100 + 50 <= 160: new passes old, which goes too
    assert d.ids == ["new", "old"] and d.overtook == 50
    d = admit(
        LaneSnapshot(p, 0, 0, 0, window_used=0, now=2.0, passed=100, guard=((120, "old"),), oldest=("old",)),
        [Candidate("x", 30, 1.0), Candidate("y", 10, 1.0)],
    )
    assert d.ids == ["y"] and d.head_reason == OVERTAKE and d.overtook == 10


def test_bad_counters_are_refused_by_name():
    try:
        overtake_key(-1)
    except ValueError as exc:
        assert "waiting_rate=-1" in str(exc)
    else:
        raise AssertionError("a negative counter was accepted")
    assert Overtaking(0, (), ()).allows(Candidate("x", 10**9, 0.0))  # no guard: the rule is off


def test_a_job_its_tenant_budget_holds_does_not_stall_the_lane_when_the_budget_is_spent():
    """The oldest job waits for its tenant's reset; with no room left to pass, the next oldest go in order."""
    p = LanePolicy(ceiling=10**9, burst_tokens=10_000, window_seconds=10.0)
    held, a, b = Candidate("j0", 100, 0.0, tenant="capped"), Candidate("j1", 200, 1.0), Candidate("j2", 50, 2.0)
    tenants = {"capped": TenantState(ceiling=1_000, spent=1_000, resets=True)}
    snap = LaneSnapshot(
        p,
        0,
        0,
        0,
        window_used=0,
        now=3.0,
        tenants=tenants,
        passed=500,
        guard=((0, "j1"), (10, "j0"), (40, "j2")),
        oldest=("j0", "j1", "j2"),
    )
    d = admit(snap, [b, a, held])
    assert d.ids == ["j1", "j2"] and d.overtook == 0 and d.parked == ()
