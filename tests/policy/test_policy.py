"""The admission policy, property-tested: pure, no database."""

from __future__ import annotations

import heapq

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lane_plugin.policy import Candidate, LanePolicy, LaneSnapshot, admit, never_fits
from lane_plugin.policy.candidate import FINISH, START, kind_of
from lane_plugin.policy.order import order, priority
from lane_plugin.policy.reserve import fit_runs, reserve_hold
from lane_plugin.policy.rules import BURST, CEILING, LEASE_CAP, RESERVE, START_LIMIT, STOPPED, unfit_before_reset
from lane_plugin.policy.sizeclass import SIZE_CLASS_MIN, size_class_boundary
from lane_plugin.policy.window import window_expiry


def snap(
    p,
    *,
    spent=0,
    reserved=0,
    leased=0,
    window_used=0,
    now=1000.0,
    stopped=False,
    started=(),
    finishing=0,
    remaining=None,
    resets=False,
):
    remaining = dict(remaining or {})
    return LaneSnapshot(
        p, spent, reserved, leased, window_used, now, stopped, frozenset(started), finishing, remaining, resets
    )


def test_smallest_first_within_burst_and_lease_cap():
    p = LanePolicy(ceiling=10_000, burst_tokens=1_000, max_leased=3, max_wait_seconds=600)
    cands = [Candidate(c, e, 990.0) for c, e in (("a", 700), ("b", 100), ("c", 200), ("d", 300), ("e", 50))]
    d = admit(snap(p), cands)
    assert d.ids == ["e", "b", "c"]  # lease cap 3 stops it
    assert d.tokens == 350
    assert d.head_reason == LEASE_CAP


def test_reserved_weight_counts_against_the_ceiling():
    """The article's tick forgot leased-but-unsettled estimates; we do not."""
    p = LanePolicy(ceiling=1_000, start_fraction=1.0, burst_tokens=1_000, max_leased=10)
    d = admit(snap(p, spent=300, reserved=600), [Candidate("a", 150, 999.0), Candidate("b", 100, 999.0)])
    assert d.ids == ["b"]
    assert d.head_reason == CEILING


def test_age_raises_priority_smoothly():
    # age factor 600 s / 1000 tokens: a 500-token job that waited 240 s more goes before a 100-token one.
    p = LanePolicy(ceiling=10_000, burst_tokens=1_000, max_leased=1, max_wait_seconds=600)
    assert p.age_factor == pytest.approx(0.6)
    big, small = Candidate("big", 500, 0.0), Candidate("small", 100, 239.0)
    assert admit(snap(p, now=300.0), [big, small]).ids == ["small"]  # 0 + 300 > 239 + 60
    assert admit(snap(p, now=300.0), [big, Candidate("small", 100, 241.0)]).ids == ["big"]  # 300 < 301
    # max_wait_seconds 0: oldest first whatever the size
    fifo = LanePolicy(ceiling=10_000, burst_tokens=1_000, max_leased=1, max_wait_seconds=0)
    assert admit(snap(fifo), [Candidate("late-small", 1, 5.0), Candidate("early-big", 900, 4.0)]).ids == ["early-big"]


def test_a_job_arriving_after_the_horizon_is_never_ahead():
    p = LanePolicy(ceiling=10_000, burst_tokens=1_000, max_wait_seconds=600)
    j = Candidate("j", 800, 50.0)
    horizon = 50.0 + (800 - 1) * p.age_factor
    later = [Candidate(f"x{e}", e, horizon + 0.001) for e in (1, 2, 500, 1_000)]
    assert order(snap(p), [j, *later])[0] == j
    assert horizon - 50.0 <= p.max_wait_seconds


def test_the_flat_start_fraction_is_still_an_option():
    p = LanePolicy(ceiling=1_000, start_fraction=0.8, burst_tokens=1_000, max_leased=10)
    cands = [Candidate("starter", 100, 999.0, run_key="new-run"), Candidate("finisher", 150, 999.0, run_key="old")]
    d = admit(snap(p, spent=650, reserved=100, started={"old"}), cands)
    assert d.ids == ["finisher"] and d.head_reason == START_LIMIT and d.shadow.id == "starter"
    # past the start limit on spend alone, a starter can never start before a reset: parked
    d = admit(snap(p, spent=750, started={"old"}), cands)
    assert d.ids == ["finisher"] and [(c.id, rule) for c, rule, _ in d.parked] == [("starter", START_LIMIT)]


def test_a_run_started_in_this_tick_lets_its_later_jobs_finish():
    p = LanePolicy(ceiling=1_000, start_fraction=0.5, burst_tokens=1_000, max_leased=10)
    cands = [Candidate("a", 400, 1.0, run_key="r"), Candidate("b", 450, 2.0, run_key="r")]
    assert admit(snap(p, now=3.0), cands).ids == ["a", "b"]


def test_the_head_keeps_its_room_and_smaller_jobs_backfill_beside_it():
    p = LanePolicy(ceiling=1_000, burst_tokens=10_000, max_leased=10, max_wait_seconds=60)
    old_big = Candidate("big", 500, 0.0)
    smalls = [Candidate(f"s{i}", 100, 990.0) for i in range(6)]
    # 600 leased: the big job fits once it settles; every small job would eat the room it waits for.
    d = admit(snap(p, reserved=600, now=1000.0), [old_big, *smalls])
    assert d.shadow == old_big and d.ids == [] and d.parked == ()
    d = admit(snap(p, reserved=300, now=1000.0), [old_big, *smalls])
    assert d.ids == ["big", "s0", "s1"]
    d = admit(snap(p, reserved=450, now=1000.0), [Candidate("big", 600, 0.0), *smalls])
    assert d.shadow.id == "big" and d.ids == []  # 450 + 600 shadow: no room beside it


def test_a_job_that_cannot_fit_before_the_reset_is_parked_and_blocks_nobody():
    """Issue 10 item 3: spent 400 of 1000, a 700-token job: parked at once; 50-token jobs go."""
    p = LanePolicy(ceiling=1_000, burst_tokens=10_000, max_leased=10, max_wait_seconds=60)
    big = Candidate("big", 700, 0.0)
    smalls = [Candidate(f"s{i}", 50, 990.0) for i in range(5)]
    d = admit(snap(p, spent=400, now=1000.0), [big, *smalls])
    assert d.ids == [f"s{i}" for i in range(5)] and d.shadow is None
    [(job, rule, why)] = d.parked
    assert job == big and rule == CEILING and "ceiling" in why and "600 of 1000" in why
    # with a period it waits for the reset instead, still without holding room
    d = admit(snap(p, spent=400, now=1000.0, resets=True), [big, *smalls])
    assert d.ids == [f"s{i}" for i in range(5)] and d.parked == () and d.head_reason == CEILING


def test_two_currencies_the_window_counts_rate_cost():
    p = LanePolicy(ceiling=100_000, burst_tokens=1_000, max_leased=10)
    cands = [Candidate("a", 100, 0.0, rate_cost=600), Candidate("b", 100, 1.0, rate_cost=600)]
    d = admit(snap(p, now=2.0), cands)
    assert d.ids == ["a"] and d.rate == 600 and d.tokens == 100 and d.head_reason == BURST
    assert d.burst_need == 600  # the window must hold at most 400 before b goes
    assert admit(snap(p, window_used=401, now=2.0), cands[:1]).ids == []


def test_finishing_reserve_holds_room_for_runs_under_way():
    p = LanePolicy(ceiling=1_000, burst_tokens=10_000, max_leased=10, max_wait_seconds=0)
    under_way = {"old": 300}  # run "old" is expected to need 300 more
    starter = Candidate("start", 100, 1.0, run_key="new", stage="draft", after=200)
    free = Candidate("free", 250, 2.0)
    finisher = Candidate("fin", 300, 3.0, run_key="old", stage="final", after=0)
    s = snap(p, spent=400, started={"old"}, finishing=300, remaining=under_way, now=10.0)
    d = admit(s, [starter, free, finisher])
    # 400 + 300 reserve + 100 + 200 (its own rest) = 1000: the starter fits exactly; then the free job
    # would eat the reserve; the finisher uses the reserve it was kept for.
    assert d.ids == ["start", "fin"] and d.head_reason == RESERVE
    assert d.finishing == 200 - 300 and dict((k, r) for k, r, _ in d.runs) == {"new": 200, "old": 0}


def test_a_finishing_job_is_not_held_back_by_a_starting_head():
    p = LanePolicy(ceiling=1_000, burst_tokens=10_000, max_leased=10, max_wait_seconds=0)
    starter = Candidate("start", 300, 1.0, run_key="new", after=100)  # needs the old run to finish first
    finisher = Candidate("fin", 300, 2.0, run_key="old")
    s = snap(p, spent=300, reserved=100, started={"old"}, finishing=300, remaining={"old": 300}, now=5.0)
    d = admit(s, [starter, finisher])
    assert d.shadow == starter and d.ids == ["fin"]


def test_a_run_that_cannot_finish_before_the_reset_does_not_start():
    p = LanePolicy(ceiling=1_000, burst_tokens=10_000, max_leased=10)
    d = admit(snap(p, spent=500), [Candidate("s", 200, 0.0, run_key="r", after=400)])
    [(_, rule, why)] = d.parked
    assert rule == RESERVE and "600 tokens" in why and "500 of the ceiling 1000" in why


def test_stopped_lane_admits_nothing():
    p = LanePolicy(ceiling=1_000)
    d = admit(snap(p, stopped=True), [Candidate("a", 1, 0.0)])
    assert d.ids == [] and d.head_reason == STOPPED


def test_now_zero_is_a_time_not_a_missing_value():
    """The seed's `now = now or time.time()` treated 0 as missing."""
    p = LanePolicy(ceiling=1_000, max_wait_seconds=0)
    assert admit(snap(p, now=0.0), [Candidate("a", 10, 0.0)]).ids == ["a"]


def test_never_fits_names_the_limit():
    p = LanePolicy(ceiling=8_000_000, burst_tokens=40_000)
    assert "burst" in never_fits(p, 40_001)
    assert never_fits(p, 40_000) is None
    assert "rate cost 50000" in never_fits(p, 100, rate_cost=50_000)
    small = LanePolicy(ceiling=1_000, burst_tokens=5_000, start_fraction=0.8)
    assert "start limit of 800" in never_fits(small, 900)
    assert never_fits(small, 900, starts_run=False) is None
    assert "ceiling" in never_fits(small, 1_001, starts_run=False)


def test_fit_runs_learns_what_follows_each_stage():
    runs = [
        [("draft", 100, 0.0), ("critique", 300, 10.0), ("final", 200, 15.0)],
        [("draft", 100, 0.0), ("critique", 500, 30.0), ("final", 400, 31.0)],
        [("draft", 90, 0.0)],  # a run that stopped after its draft
    ]
    fit = fit_runs(runs)
    assert fit["draft"].after == -(-(500 + 900 + 0) // 3) and fit["draft"].runs == 3
    assert fit["critique"].after == 300 and fit["final"].after == 0
    assert fit["draft"].hold == 2 * 30.0 and fit["final"].hold == 0.0
    assert reserve_hold(LanePolicy(ceiling=1, lease_seconds=90.0), fit["draft"]) == 90.0


# -- properties ----------------------------------------------------------------
policies = st.builds(
    LanePolicy,
    ceiling=st.integers(1, 5_000),
    start_fraction=st.sampled_from([0.5, 0.8, 1.0]),
    burst_tokens=st.integers(1, 3_000),
    window_seconds=st.just(1.0),
    max_leased=st.integers(1, 8),
    max_wait_seconds=st.sampled_from([0.0, 30.0, 600.0]),
)


@st.composite
def scenarios(draw):
    p = draw(policies)
    spent = draw(st.integers(0, p.ceiling))
    reserved = draw(st.integers(0, p.ceiling - spent))
    leased = draw(st.integers(0, p.max_leased))
    window_used = draw(st.integers(0, p.burst_tokens))
    now = draw(st.floats(0, 2_000))
    runs = ["r1", "r2", "r3", None]
    n = draw(st.integers(0, 12))
    cands = [
        Candidate(
            f"j{i}",
            draw(st.integers(1, 1_500)),
            draw(st.floats(0, 2_000)),
            draw(st.sampled_from(runs)),
            draw(st.none() | st.integers(1, 1_500)),
            "s",
            draw(st.integers(0, 800)),
        )
        for i in range(n)
    ]
    started = draw(st.sets(st.sampled_from(["r1", "r2", "r3"])))
    remaining = {r: draw(st.integers(0, 500)) for r in started}
    finishing = sum(remaining.values()) + draw(st.integers(0, 300))  # runs without candidates hold some too
    return snap(
        p,
        spent=spent,
        reserved=reserved,
        leased=leased,
        window_used=window_used,
        now=now,
        stopped=draw(st.booleans()),
        started=started,
        finishing=finishing,
        remaining=remaining,
        resets=draw(st.booleans()),
    ), cands


@settings(max_examples=500, deadline=None)
@given(scenarios())
def test_never_admits_past_ceiling_reserve_start_limit_burst_or_lease_cap(case):
    s, cands = case
    d = admit(s, cands)
    p = s.policy
    committed, window, leased, finishing = s.spent + s.reserved, s.window_used, s.leased, s.finishing
    started, remaining = set(s.started_runs), dict(s.run_remaining)
    for c in d.admitted:
        kind = kind_of(c, started)
        if kind != FINISH:  # starting and free jobs leave every run's reserve, and their own
            assert committed + finishing + c.est + (c.after if kind == START else 0) <= p.ceiling
        if kind == START:
            assert committed + c.est <= p.start_limit
        committed += c.est
        window += c.rate
        leased += 1
        assert committed <= p.ceiling
        if c.run_key:
            finishing += c.after - remaining.get(c.run_key, 0)
            remaining[c.run_key] = c.after
            started.add(c.run_key)
    assert window <= p.burst_tokens
    assert leased <= p.max_leased
    assert d.tokens == sum(c.est for c in d.admitted) and d.rate == sum(c.rate for c in d.admitted)
    assert d.finishing == finishing - s.finishing
    if s.stopped:
        assert d.admitted == () and d.parked == ()
    if s.resets:
        assert d.parked == ()
    ordered = order(s, cands)
    for c, _, _ in d.parked:  # parked only if spend alone leaves it no room
        ahead = {x.run_key for x in d.admitted if ordered.index(x) < ordered.index(c)}
        kind = kind_of(c, s.started_runs | ahead)
        assert (
            c.rate > p.burst_tokens
            or s.spent + c.est > p.ceiling
            or s.spent + c.est + (c.after if kind == START else 0) > p.ceiling
            or (kind == START and s.spent + c.est > p.start_limit)
        )


@settings(max_examples=300, deadline=None)
@given(scenarios(), st.randoms(use_true_random=False))
def test_same_input_same_output_whatever_the_input_order(case, rnd):
    s, cands = case
    shuffled = list(cands)
    rnd.shuffle(shuffled)
    assert admit(s, cands) == admit(s, shuffled)


@settings(max_examples=500, deadline=None)
@given(scenarios())
def test_what_is_admitted_behind_the_head_leaves_it_room(case):
    """Backfilling: jobs after the head in the order take only room the head does not need."""
    s, cands = case
    d = admit(s, cands)
    ordered = order(s, cands)
    p, out = s.policy, set(d.admitted) | {c for c, _, _ in d.parked}

    def can_wait_for_room(c):  # not a job that cannot fit before the reset (those hold nothing)
        kind = kind_of(c, s.started_runs | {x.run_key for x in d.admitted if ordered.index(x) < ordered.index(c)})
        need = c.est + (c.after if kind == START else 0)
        return unfit_before_reset(p, c, kind, spent=s.spent, need=need) is None

    h = next((c for c in ordered if c not in out and can_wait_for_room(c)), None)  # the head: first left waiting
    if h is None:
        return
    assert d.shadow in (h, None)
    before = [c for c in d.admitted if ordered.index(c) < ordered.index(h)]
    behind = [c for c in d.admitted if ordered.index(c) > ordered.index(h)]
    started = s.started_runs | {c.run_key for c in before if c.run_key}
    h_kind = kind_of(h, started)
    held = [c for c in behind if h_kind == FINISH or kind_of(c, started) != FINISH]
    committed = s.spent + s.reserved + sum(c.est for c in before)
    assert committed + h.est + sum(c.est for c in held) <= p.ceiling or not held
    assert (
        s.window_used + sum(c.rate for c in before) + h.rate + sum(c.rate for c in behind) <= p.burst_tokens
        or not behind
    )
    assert s.leased + len(before) + 1 + len(behind) <= p.max_leased or not behind


@settings(max_examples=300, deadline=None)
@given(scenarios())
def test_an_idle_lane_admits_or_parks_its_first_job(case):
    """Progress: with nothing leased, no reserve held and an empty window, the first job goes or is parked."""
    s, cands = case
    if not cands or s.stopped:
        return
    idle = snap(s.policy, spent=s.spent, now=s.now, started=s.started_runs, resets=False)
    free_cands = [Candidate(c.id, c.est, c.waiting_since, None, c.rate_cost) for c in cands]
    d = admit(idle, free_cands)
    first = order(idle, free_cands)[0]
    assert first in d.admitted or first in [c for c, _, _ in d.parked]


# -- many ticks: the sliding window over any span, and the wait bound ------------------------
@st.composite
def traffic(draw):
    p = LanePolicy(
        ceiling=draw(st.integers(500, 20_000)),
        burst_tokens=draw(st.integers(200, 3_000)),
        window_seconds=draw(st.sampled_from([1.0, 5.0, 60.0])),
        max_leased=draw(st.integers(1, 6)),
        max_wait_seconds=draw(st.sampled_from([0.0, 10.0, 120.0])),
    )
    jobs = [
        (
            draw(st.floats(0, 200).map(lambda x: round(x, 1))),
            draw(st.integers(1, min(p.ceiling, p.burst_tokens))),
            draw(st.none() | st.integers(1, p.burst_tokens)),
            draw(st.floats(0.3, 1.0)),
        )
        for _ in range(draw(st.integers(1, 30)))
    ]
    # The size-class boundary each job is placed by: none (one continuous priority), or one the
    # lane refits while jobs wait (so jobs placed by different boundaries meet in the queue).
    bounds = draw(st.lists(st.none() | st.integers(1, min(p.ceiling, p.burst_tokens)), min_size=1, max_size=3))
    placed_by = [draw(st.sampled_from(bounds)) for _ in jobs]
    return p, jobs, draw(st.sampled_from([0.5, 3.0, 30.0])), placed_by


def run_ticks(p: LanePolicy, jobs, service: float, placed_by=None):
    """Tick at every arrival, settlement and window expiry; returns what happened to each job.

    ``placed_by[i]``: the size-class boundary job i's priority was computed with (None: none).
    """
    placed_by = placed_by or [None] * len(jobs)
    events = [(t, "arrive", i) for i, (t, *_) in enumerate(jobs)]
    heapq.heapify(events)
    waiting: dict[str, Candidate] = {}
    spent = reserved = leased = 0
    charges: list[tuple[float, int]] = []
    admitted_at, parked_at, head_since, ticks = {}, {}, {}, []
    while events:
        t = events[0][0]
        while events and events[0][0] == t:
            _, kind, i = heapq.heappop(events)
            if kind == "arrive":
                prio = priority(p, jobs[i][1], jobs[i][0], placed_by[i])
                assert prio <= jobs[i][0] + p.max_wait_seconds + 1e-9  # the most any job's place adds
                waiting[f"j{i:03d}"] = Candidate(f"j{i:03d}", jobs[i][1], jobs[i][0], None, jobs[i][2], prio=prio)
            elif kind == "settle":
                est, actual = i
                spent, reserved, leased = spent + actual, reserved - est, leased - 1
        window = sum(c for at, c in charges if at > t - p.window_seconds)
        d = admit(LaneSnapshot(p, spent, reserved, leased, window, t), waiting.values())
        for c in d.admitted:
            actual = int(c.est * jobs[int(c.id[1:])][3])
            reserved, leased = reserved + c.est, leased + 1
            charges.append((t, c.rate))
            admitted_at[c.id] = t
            heapq.heappush(events, (t + service, "settle", (c.est, actual)))
            heapq.heappush(events, (window_expiry(t, p.window_seconds), "window", 0))
            del waiting[c.id]
        for c, _, _ in d.parked:
            parked_at[c.id] = t
            del waiting[c.id]
        if waiting:  # the head: the first job left waiting, once past its horizon
            h = min(waiting.values(), key=lambda c: (c.prio, c.id))
            # past it no arrival gets ahead: an arrival at t has prio >= t (>= t + age_factor if none is classed)
            if (t > h.prio) if any(b is not None for b in placed_by) else t >= h.prio - p.age_factor:
                head_since.setdefault(h.id, t)
        ticks.append((t, spent + reserved, leased, window + d.rate))
    return waiting, charges, admitted_at, parked_at, head_since, ticks


@settings(max_examples=300, deadline=None)
@given(traffic())
def test_many_ticks_keep_every_limit_and_the_wait_bound(case):
    p, jobs, service, placed_by = case
    waiting, charges, admitted_at, parked_at, head_since, ticks = run_ticks(p, jobs, service, placed_by)
    for _, committed, leased, window in ticks:
        assert committed <= p.ceiling and leased <= p.max_leased and window <= p.burst_tokens
    # no span of window_seconds admits more than the burst (the worst span ends at an admission)
    for end, _ in charges:
        assert sum(c for at, c in charges if end - p.window_seconds < at <= end) <= p.burst_tokens
    # liveness: when traffic stops and work settles, nothing is left waiting
    assert not waiting
    # the bound: once a job is the head past its horizon (no later arrival can get ahead of it),
    # it is admitted or parked as soon as the work leased before it settles and the window slides.
    for job_id, since in head_since.items():
        done = admitted_at.get(job_id, parked_at.get(job_id))
        assert done <= since + max(service, p.window_seconds) + 1e-9, (job_id, since, done)


def test_two_size_classes_put_big_jobs_max_wait_behind():
    p = LanePolicy(ceiling=10_000, burst_tokens=1_000, max_wait_seconds=600)
    assert priority(p, 300, 10.0, None) == priority(p, 300, 10.0) == 10.0 + 300 * p.age_factor
    assert priority(p, 300, 10.0, 300) == 10.0  # at the boundary: the small class
    assert priority(p, 301, 10.0, 300) == 610.0
    # a job finishing a run under way is not held back by its size: the continuous priority
    assert priority(p, 900, 10.0, 300, finishing=True) == priority(p, 900, 10.0) == 10.0 + 900 * p.age_factor
    # a big job waiting since 0 goes before a small one arriving after 600 s, not before one at 600 s
    big = Candidate("big", 900, 0.0, prio=priority(p, 900, 0.0, 300))
    assert order(snap(p), [big, Candidate("a", 1, 600.001, prio=priority(p, 1, 600.001, 300))])[0] == big
    assert order(snap(p), [big, Candidate("a", 1, 599.0, prio=priority(p, 1, 599.0, 300))])[0].id == "a"


def test_size_class_boundary_is_the_60th_percentile_of_enough_estimates():
    assert size_class_boundary([7] * (SIZE_CLASS_MIN - 1)) is None
    assert size_class_boundary(range(1, 501)) == 301  # ranked[int(0.6 * 500)]
    assert size_class_boundary(reversed(range(1, 101))) == 61
    assert size_class_boundary([4] * 60 + [9] * 40) == 9  # ranked[60]: the first of the 9s
    with pytest.raises(ValueError, match="pct"):
        size_class_boundary(range(100), pct=101)
