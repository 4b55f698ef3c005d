"""The ``lane`` policy's fast path makes exactly the admissions of the path it replaced.

The reference (tests/sim/reference_lane.py, main at 31b2d84) read the whole two-range head at every
tick, sorted it and scanned all of it, and refit the finishing reserve from every lapsed run anew.
The fast path reads the head lazily in order, stops once the lease cap binds and nothing can be
parked, and refits incrementally. On seeded traffic covering every rule (budget-bound runs with a
daily reset and a deadline, ceiling-bound single calls parked, a binding burst window, leases that
expire) the two must log the same tick, settlement, park and expiry at the same instant.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings

from lane_plugin.policy import admit
from lane_plugin.policy.order import order, priority
from lane_plugin.policy.reserve import fit_runs
from lane_plugin.policy.sizeclass import SIZE_CLASS_MIN, SIZE_CLASS_SAMPLE, size_class_boundary
from lane_plugin.sim import lanequeue as sim_lanequeue
from lane_plugin.sim import policies as sim_policies
from lane_plugin.sim import runs as sim_runs
from lane_plugin.sim.engine import SimConfig, simulate
from lane_plugin.sim.traffic import Trace, generate

from ..policy.test_policy import scenarios
from . import reference_lane
from .reference_lane import push_reference, reference_admit, refit_reference, select_lane_reference, started_reference

SCENARIOS = {
    "chained-budget": (
        dict(jobs=3_000, days=1.0, mix="lognormal", drift=1.3, stages=3, median=400.0),
        dict(
            ceiling=250_000,
            allowance=500_000,
            burst_tokens=40_000,
            window_seconds=1.0,
            max_leased=8,
            lease_seconds=900.0,
            period_seconds=21_600.0,
            workers=4,
            service_base=4.0,
            service_per_token=0.023,
            deadline=7_200.0,
        ),
    ),
    "ceiling-parks": (
        dict(jobs=2_000, days=0.05, mix="bimodal", stages=1, median=2_000.0),
        dict(
            ceiling=1_500_000,
            burst_tokens=400_000,
            window_seconds=60.0,
            max_leased=4,
            workers=4,
            lease_seconds=900.0,
            service_base=0.5,
            service_per_token=0.01,
        ),
    ),
    "reserve-parks": (
        dict(jobs=3_000, days=0.1, mix="lognormal", drift=1.2, stages=3, median=600.0),
        dict(
            ceiling=900_000,
            burst_tokens=60_000,
            window_seconds=10.0,
            max_leased=6,
            workers=4,
            lease_seconds=900.0,
            service_base=1.0,
            service_per_token=0.002,
        ),
    ),
    "learned-headroom": (
        dict(n=2_500),  # est and est_var learned online: the headroom rule in play
        dict(
            ceiling=2_000_000,
            burst_tokens=400_000,
            window_seconds=60.0,
            max_leased=8,
            workers=6,
            lease_seconds=900.0,
            service_base=0.5,
            service_per_output_token=0.02,
            estimator="learned",
            warmup=100,
        ),
    ),
    "rate-bound": (
        dict(jobs=2_000, days=0.05, mix="lognormal", stages=2, median=1_500.0),
        dict(
            ceiling=10**12,
            allowance=10**12,
            burst_tokens=30_000,
            window_seconds=60.0,
            max_leased=64,
            workers=64,
            lease_seconds=900.0,
            service_base=0.5,
            service_per_token=0.01,
        ),
    ),
    "expiring": (
        dict(jobs=1_500, days=0.02, mix="uniform", drift=1.1, stages=3, median=800.0),
        dict(
            ceiling=2_000_000,
            burst_tokens=40_000,
            window_seconds=5.0,
            max_leased=12,
            workers=2,
            lease_seconds=20.0,
            max_attempts=2,
            service_base=3.0,
            service_per_token=0.002,
        ),
    ),
}


def calls(n: int, seed: int) -> Trace:
    """Single calls and 2-stage runs with known input and output tokens (what the learned estimator reads)."""
    rng, tr = random.Random(seed), Trace()
    for i in range(n):
        inp, out = int(rng.lognormvariate(7, 1)) + 1, int(rng.lognormvariate(5, 0.8)) + 1
        tr.add(
            i * 1.5,
            f"s{i % 2}",
            inp + 256,
            inp + out,
            f"r{i // 2}" if i % 3 else None,
            inp + 2048,
            input_tokens=inp,
            output_tokens=out,
        )
    return tr.sort()


def run(name: str, seed: int):
    gen, cfg = SCENARIOS[name]
    trace = calls(seed=seed, **gen) if "estimator" in cfg else generate(seed=seed, **gen)
    # the order alone: the reference push below does not number arrivals (rule 12's rooms: tests/sim/test_rooms.py)
    return simulate(trace, SimConfig(**cfg, overtake_slack=None), ["lane"], record=True)[0]


@pytest.mark.parametrize("classes", ["learned", "none"])
@pytest.mark.parametrize("seed", [1, 7])
@pytest.mark.parametrize("name", list(SCENARIOS))
def test_the_fast_path_admits_what_the_reference_admits(name, seed, classes, monkeypatch):
    """With the size classes learned, and with none (boundary None: the reference exactly as it was)."""
    if classes == "none":
        monkeypatch.setattr(sim_lanequeue, "size_class_boundary", lambda ests: None)
        monkeypatch.setattr(reference_lane, "size_class_boundary", lambda ests: None)
    fast = run(name, seed)
    monkeypatch.setitem(sim_policies.POLICIES, "lane", select_lane_reference)
    monkeypatch.setattr(sim_runs.RunBook, "refit", refit_reference)
    monkeypatch.setattr(sim_policies.LaneQueue, "push", push_reference)
    monkeypatch.setattr(sim_policies.LaneQueue, "started", started_reference)
    ref = run(name, seed)
    ticks = [e for e in ref.log if e[0] == "tick" and e[2]]
    assert len(ticks) > 50, "the scenario must make the policy choose, many times"
    assert fast.log == ref.log
    for figure in ("done", "parked", "expired", "spent", "over_ceiling", "wait_p50", "wait_p99", "stranded_tokens"):
        assert getattr(fast, figure) == getattr(ref, figure), figure


@pytest.mark.parametrize("name", ["chained-budget", "expiring"])
def test_the_incremental_refit_learns_what_fit_runs_learns_from_every_lapsed_run(name, monkeypatch):
    real, checked = sim_runs.RunBook.refit, []

    def refit(book, now):
        dirty = book._dirty or book.lapse(now) or book._dirty
        real(book, now)
        # every run under way reserves what the profile gives its stage, and the lane their sum
        under_way = [r for r in book.runs.values() if r.expires_at is not None]
        assert book.finishing == sum(book.after(r.stage) for r in under_way)
        if not dirty:
            return
        sequences = [
            book._sequence(key, book.runs[key])
            for last_at, _, key in book._lapsed
            if book.runs[key].expires_at is None and book.runs[key].last_at == last_at
        ]
        fit = fit_runs(sequences)
        assert {s: book.profile[s] for s in fit} == fit
        assert {s: n for s, (_, n, _) in book._sums.items() if n} == {s: f.runs for s, f in fit.items()}
        checked.append(len(sequences))

    monkeypatch.setattr(sim_runs.RunBook, "refit", refit)
    run(name, 3)
    assert len(checked) > 5 and max(checked) > 50  # many refits, over many lapsed runs


@settings(max_examples=500, deadline=None)
@given(scenarios())
def test_admit_in_order_and_stopping_early_decides_as_the_reference(case):
    """Any lane, any head: read lazily in order (and stopped once the cap binds), the same decision."""
    s, cands = case
    ref = reference_admit(s, cands)
    assert admit(s, cands) == ref
    assert admit(s, iter(order(s, cands)), ordered=True) == ref


def test_a_job_that_takes_exactly_what_spend_leaves_is_admitted_before_the_reset():
    """The fast path skips admission only when every waiting job is bigger than what is left."""
    tr = Trace()
    tr.add(0.0, "s", 100, 100, None)
    tr.add(5.0, "s", 50, 50, None)
    cfg = SimConfig(
        ceiling=150,
        allowance=150,
        burst_tokens=1_000,
        period_seconds=86_400.0,
        max_leased=1,
        service_base=1.0,
        service_per_token=0.0,
    )
    (lane,) = simulate(tr.sort(), cfg, ["lane"], record=True)
    assert [(e[1], e[2]) for e in lane.log if e[0] == "tick" and e[2]] == [(0.0, ["j0000000"]), (5.0, ["j0000001"])]


def test_the_lane_learns_its_size_classes_from_its_last_estimates_as_the_ledger_does(monkeypatch):
    """Every refit sets the boundary of the last SIZE_CLASS_SAMPLE estimates pushed; a job is placed by
    the boundary known when it entered (and keeps that place), a later stage of a run under way without it."""
    real, seen = sim_policies.LaneQueue.refit, []

    def refit(q, now):
        real(q, now)
        seen.append((len(q.recent), q.size_boundary))
        assert q.size_boundary == size_class_boundary(q.recent)
        assert len(q.recent) == min(SIZE_CLASS_SAMPLE, len(q._prio))

    monkeypatch.setattr(sim_policies.LaneQueue, "refit", refit)
    placed, classed = [], []
    push = sim_policies.LaneQueue.push

    def checked_push(q, j):
        known, key = j in q._prio, q.sim.trace.run_key[j]
        finishing = key is not None and key in q.runs.runs  # a later stage of a run under way
        push(q, j)
        if not known:
            place = priority(q.policy, q.sim.est[j], q.sim.waiting_since[j], q.size_boundary, finishing)
            placed.append(q._prio[j] == place)
            classed.append(q.size_boundary is not None and not finishing)

    monkeypatch.setattr(sim_policies.LaneQueue, "push", checked_push)
    run("rate-bound", 1)
    assert all(placed) and len(placed) > 1_000
    assert 500 < sum(classed) < len(classed)  # most starting stages placed by class, later stages not
    assert seen[0] == (seen[0][0], None) and seen[0][0] < SIZE_CLASS_MIN  # nothing known at the first tick
    assert any(b is not None for _, b in seen) and any(n == SIZE_CLASS_SAMPLE for n, _ in seen)
