"""The deadline rule (lane_plugin.policy.order): waits bounded against token-fifo's, by construction.

A rate-bound lane (ample budget and lease slots, a sliding window of ``burst`` rate tokens per
``window`` seconds) admits each second what :func:`admit` chooses (the very code the ledger runs)
from random arrivals of random sizes in up to three tenants of random weights. Each job gets its
deadline at arrival from the rate tokens waiting then (:func:`due_at`). The bound the order's
docstring proves, checked for every job J::

    wait_J <= beta * F_J + (V_J + A_J) / mu' + 2 * window + 1

``V_J`` the rate tokens waiting when J arrived, ``F_J = V_J * window / burst`` token-fifo's wait,
``A_J`` the tokens of jobs arriving after J with a deadline no later than J's (none when deadlines are
monotone), ``mu' = (burst - largest rate) / window`` what the window admits per second while a head
waits for room; ``+ 2 * window + 1``: the window's state at the deadline and one tick.
"""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from lane_plugin.policy import Candidate, LanePolicy, LaneSnapshot, admit
from lane_plugin.policy.fairness import TenantState
from lane_plugin.policy.order import due_at

WINDOW = 10.0


def _run(seed: int, burst: int, beta: float, n: int, load: float, deadlines: bool, jobs=None):
    rng = random.Random(seed)
    policy = LanePolicy(ceiling=10**12, burst_tokens=burst, window_seconds=WINDOW, max_leased=10**6,
                        max_wait_seconds=600.0)  # fmt: skip
    if jobs is None:  # (arrival second, est, tenant): mean demand `load` x the window's rate
        mean = burst / WINDOW * load
        jobs, t = [], 0
        while len(jobs) < n:
            for _ in range(rng.randint(0, 3)):
                est = rng.choice([rng.randint(10, burst // 20), rng.randint(burst // 4, burst // 2)])
                jobs.append((t, est, rng.choice("abc")))
            t += max(1, round(rng.expovariate(mean / max(1, burst // 6))))
        jobs = jobs[:n]
    weights = {"a": 1.0, "b": float(rng.randint(1, 4)), "c": 1.0}
    served = {t: 0.0 for t in weights}
    waiting: dict[str, Candidate] = {}
    waiting_rate, window = 0, []  # window: (second, rate) admitted
    v, due, admitted_at = {}, {}, {}
    i, now = 0, 0
    while len(admitted_at) < len(jobs):
        while i < len(jobs) and jobs[i][0] <= now:
            at, est, tenant = jobs[i]
            jid = f"j{i:05d}"
            v[jid] = waiting_rate
            due[jid] = due_at(policy, float(at), waiting_rate, beta)
            waiting[jid] = Candidate(jid, est, float(at), tenant=tenant, due_at=due[jid] if deadlines else None)
            waiting_rate += est
            i += 1
        window = [(s, r) for s, r in window if s > now - WINDOW]
        tenants = {t: TenantState(weight=w, served=served[t]) for t, w in weights.items()}
        snap = LaneSnapshot(policy, spent=0, reserved=0, leased=0, window_used=sum(r for _, r in window),
                            now=float(now), tenants=tenants)  # fmt: skip
        for c in admit(snap, list(waiting.values())).admitted:
            del waiting[c.id]
            waiting_rate -= c.est
            window.append((now, c.est))
            served[c.tenant] += c.est / weights[c.tenant]
            admitted_at[c.id] = now
        now += 1
    return jobs, v, due, admitted_at, policy


def _violations(jobs, v, due, admitted_at, policy, beta):
    burst, largest = policy.burst_tokens, max(e for _, e, _ in jobs)
    mu = (burst - largest) / WINDOW
    out = []
    for idx, (at, est, _) in enumerate(jobs):
        jid = f"j{idx:05d}"
        later = sum(jobs[k][1] for k in range(idx + 1, len(jobs)) if due[f"j{k:05d}"] <= due[jid])
        fifo = v[jid] * WINDOW / burst
        bound = beta * fifo + (v[jid] + later) / mu + 2 * WINDOW + 1
        if admitted_at[jid] - at > bound:
            out.append((jid, admitted_at[jid] - at, bound))
    return out


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**32), beta=st.sampled_from([0.1, 0.25, 0.5]), load=st.floats(0.6, 1.6))
def test_every_wait_is_within_beta_of_token_fifos_plus_the_drain(seed, beta, load):
    jobs, v, due, admitted_at, policy = _run(seed, 20_000, beta, 150, load, deadlines=True)
    assert _violations(jobs, v, due, admitted_at, policy, beta) == []


def test_without_deadlines_a_big_job_waits_past_the_bound():
    """The bound is the rule's: a big job in a stream of small ones waits past it without deadlines.

    (The size classes hold it while small jobs keep the window full: with deadlines it goes first once
    overdue.)
    """
    burst, beta = 20_000, 0.25
    jobs = [(0, 9_000, "a")] + [(0, 1_000, "a")] * 20
    jobs += [(t, 1_000, "b") for t in range(1, 300) for _ in range(2)]
    without = _run(0, burst, beta, len(jobs), 1.0, deadlines=False, jobs=jobs)
    late = _violations(*without, beta)
    assert any(jid == "j00000" for jid, _, _ in late), late
    assert _violations(*_run(0, burst, beta, len(jobs), 1.0, deadlines=True, jobs=jobs), beta) == []
