"""The simulator on tiny traces whose admission order and waits are worked out by hand."""

from __future__ import annotations

import json
import math

import pytest

from lane_plugin.errors import TraceError
from lane_plugin.sim import policies as sim_policies
from lane_plugin.sim.engine import SimConfig, percentile, simulate
from lane_plugin.sim.readers import load_csv, write_csv
from lane_plugin.sim.traffic import Trace, generate


def trace(*jobs) -> Trace:
    """jobs: (arrival, est[, actual[, run_key]]); actual defaults to est."""
    tr = Trace()
    for job in jobs:
        arrival, est, *rest = job
        actual = rest[0] if rest else est
        run_key = rest[1] if len(rest) > 1 else None
        tr.add(arrival, "s", est, actual, run_key)
    return tr.sort()


# One slow worker, one lease at a time, 10 s per job whatever its size.
ONE_AT_A_TIME = dict(
    ceiling=100_000,
    start_fraction=1.0,
    burst_tokens=10_000,
    max_leased=1,
    service_base=10.0,
    service_per_token=0.0,
    lease_seconds=1_000.0,
    max_wait_seconds=1_000.0,
)
ABC = trace((0, 300), (1, 200), (2, 100))  # j0 = A, j1 = B, j2 = C


def admissions(result) -> list[str]:
    return [jid for kind, _, *rest in result.log if kind == "tick" for jid in rest[0]]


def run_one(tr: Trace, policy: str, **cfg):
    (res,) = simulate(tr, SimConfig(**cfg), [policy], record=True)
    return res


def test_lane_admits_smallest_first_with_exact_waits():
    # t=0 A leased (worker busy to 10); B, C wait (no free slot). t=10 A settles,
    # the smallest waiting job C goes (to 20), then B (to 30).
    res = run_one(ABC, "lane", horizon=100, **ONE_AT_A_TIME)
    assert admissions(res) == ["j0000000", "j0000002", "j0000001"]
    assert res.waits == [0.0, 19.0, 8.0]
    assert (res.done, res.spent, res.over_ceiling) == (3, 600, 0)
    assert res.busy_pct == pytest.approx(30.0)  # 30 s of work in the 100 s horizon


def test_count_is_fifo():
    res = run_one(ABC, "count", horizon=100, **ONE_AT_A_TIME)
    assert admissions(res) == ["j0000000", "j0000001", "j0000002"]
    assert res.waits == [0.0, 9.0, 18.0]


def test_age_outweighs_size_when_max_wait_is_short():
    # Priority = arrival + est * 8.5 s / 10,000 tokens: B (1 + 0.17) goes before the smaller C (2 + 0.085).
    cfg = {**ONE_AT_A_TIME, "max_wait_seconds": 8.5}
    res = run_one(ABC, "lane", horizon=100, **cfg)
    assert admissions(res) == ["j0000000", "j0000001", "j0000002"]
    assert res.waits == [0.0, 9.0, 18.0]


def test_smallest_first_overspends_and_lane_does_not():
    # Five 300-token jobs at once, ceiling 1000. The seed's tick checks each
    # est against ceiling - spent (spent is still 0) and admits all five.
    tr = trace(*[(0, 300)] * 5)
    cfg = dict(
        ceiling=1_000,
        start_fraction=1.0,
        max_leased=10,
        burst_tokens=10_000,
        service_base=1.0,
        service_per_token=0.0,
        horizon=100,
    )
    seed, fifo, lane = simulate(tr, SimConfig(**cfg), ["smallest-first", "token-fifo", "lane"])
    assert (seed.done, seed.spent, seed.over_ceiling) == (5, 1_500, 500)
    assert (fifo.done, fifo.spent, fifo.over_ceiling) == (3, 900, 0)
    assert (lane.done, lane.spent, lane.over_ceiling) == (3, 900, 0)


def test_token_fifo_blocks_behind_its_head_and_lane_backfills():
    # 600 then 500 then 100, ceiling 1000: FIFO stops at the 500 and never
    # looks at the 100 behind it; the lane admits 600 + 100.
    tr = trace((0, 600), (0.5, 500), (1, 100))
    cfg = dict(
        ceiling=1_000,
        start_fraction=1.0,
        max_leased=10,
        burst_tokens=10_000,
        service_base=100.0,
        service_per_token=0.0,
        horizon=50,
        lease_seconds=500.0,
    )
    fifo, lane = simulate(tr, SimConfig(**cfg), ["token-fifo", "lane"], record=True)
    assert admissions(fifo) == ["j0000000"]
    assert admissions(lane) == ["j0000000", "j0000002"]


def test_start_limit_keeps_the_last_fifth_for_finishing():
    # ceiling 1000, start_fraction 0.8 (the article's flat stop, an option): start at most 800
    # committed. Run r1's first stage (700) is admitted; a new run's 200 would start past 800 and
    # waits; r1's second stage (250) finishes a run already under way and goes in. Recorded
    # arrivals (chain=False): r1's second stage arrives while its first runs.
    tr = trace((0, 700, 700, "r1"), (1, 200, 200, "r2"), (2, 250, 250, "r1"))
    cfg = dict(
        ceiling=1_000,
        start_fraction=0.8,
        max_leased=10,
        burst_tokens=10_000,
        service_base=100.0,
        service_per_token=0.0,
        horizon=50,
        lease_seconds=500.0,
        chain=False,
    )
    res = run_one(tr, "lane", **cfg)
    assert admissions(res) == ["j0000000", "j0000002"]


def test_burst_window_slides():
    # burst 500 in any 10 s: the third 200-token job waits until the first leaves the window at t=10.
    tr = trace((0, 200), (1, 200), (2, 200))
    cfg = dict(
        ceiling=10_000,
        start_fraction=1.0,
        max_leased=10,
        burst_tokens=500,
        window_seconds=10.0,
        service_base=1.0,
        service_per_token=0.0,
        workers=3,
        horizon=100,
    )
    res = run_one(tr, "lane", **cfg)
    assert res.waits == [0.0, 0.0, 8.0]
    assert [e[1] for e in res.log if e[0] == "tick" and e[2]] == [0.0, 1.0, 10.0]


def test_smallest_first_starves_a_big_job_and_aging_does_not():
    # A small job every 4 s, each served in 5 s, one lease at a time: there is
    # always a smaller job waiting when the worker frees, so the 500 never goes
    # under smallest-first. In the lane a token of size is worth 30 s / 600 = 0.05 s
    # of waiting: the 500 (arrived 0.5) ranks as if it arrived at 25.5, so the small
    # jobs that arrived up to t=20 go first and it goes at t=30, when they are done.
    tr = trace((0.5, 500), *[(4.0 * i, 100) for i in range(60)])
    cfg = dict(
        ceiling=10**6,
        start_fraction=1.0,
        max_leased=1,
        burst_tokens=600,
        service_base=5.0,
        service_per_token=0.0,
        max_wait_seconds=30.0,
        horizon=240,
        starve_after=60.0,
    )
    seed, lane = simulate(tr, SimConfig(**cfg), ["smallest-first", "lane"])
    big = 1  # index of the 500-token job after sorting by arrival (the small one at 0 is j0)
    assert seed.starved == 1 and seed.waits[big] == pytest.approx(239.5)
    assert lane.starved == 0 and lane.waits[big] == pytest.approx(29.5)
    assert lane.waits[big] <= cfg["max_wait_seconds"]


def test_cold_drainer_expires_leases_and_preflight_prevents_it():
    # The worker sleeps in [50, 100) of every 100 s. A job admitted at 60 with a
    # 30 s lease is not started by 90: the lease expires, the job is leased
    # again, and the worker starts it at 100. With the preflight the lane is
    # stopped while the worker sleeps and admits it once, at 100.
    tr = trace((60, 100))
    cfg = dict(
        ceiling=10_000,
        start_fraction=1.0,
        sleep_every=100.0,
        sleep_seconds=50.0,
        lease_seconds=30.0,
        service_base=5.0,
        service_per_token=0.0,
        horizon=200,
    )
    cold = run_one(tr, "lane", **cfg)
    assert (cold.expired, cold.done, cold.waits) == (1, 1, [40.0])  # waits until the worker starts it
    assert [e[:2] for e in cold.log if e[0] != "tick"] == [("submit", 60.0), ("expire", 90.0), ("settle", 105.0)]
    warm = run_one(tr, "lane", preflight=True, **cfg)
    assert (warm.expired, warm.done, warm.waits) == (0, 1, [40.0])


def test_expired_leases_park_after_max_attempts():
    tr = trace((60, 100))
    cfg = dict(
        ceiling=10_000,
        start_fraction=1.0,
        sleep_every=1000.0,
        sleep_seconds=950.0,
        lease_seconds=10.0,
        max_attempts=3,
        horizon=500,
    )
    res = run_one(tr, "lane", **cfg)
    assert (res.expired, res.parked, res.done) == (3, 1, 0)


def test_deadline_parks_a_job_still_waiting():
    res = run_one(trace((0, 100), (1, 100)), "lane", deadline=5.0, horizon=100, **ONE_AT_A_TIME)
    assert (res.parked, res.done) == (1, 1)
    assert res.waits == [0.0, None]  # parked jobs are counted apart, not as waits


def test_daily_period_resets_spent_and_counts_overspend_per_day():
    # count ignores tokens: 3 x 300 on day one and on day two against a 500 ceiling.
    tr = trace(*[(t + i, 300) for t in (0, 86_400 + 10) for i in range(3)])
    res = run_one(tr, "count", ceiling=500, allowance=800, period_seconds=86_400.0, horizon=200_000)
    assert (res.over_ceiling, res.over_allowance, res.peak_period_spent) == (800, 200, 900)


def test_lane_reads_only_a_bounded_head(monkeypatch):
    sizes = []
    real = sim_policies.admit

    def spy(snapshot, candidates, **kw):  # read all of what the engine offers (admission may read less)
        candidates = list(candidates)
        sizes.append(len(candidates))
        return real(snapshot, candidates, **kw)

    monkeypatch.setattr(sim_policies, "admit", spy)
    tr = trace(*[(0.001 * i, 100 + i % 50) for i in range(3_000)])
    run_one(tr, "lane", max_leased=4, max_wait_seconds=0.0, service_base=1.0, horizon=50)
    assert max(sizes) <= 2 * (4 + sim_policies.HEAD_SLACK)


def test_refused_at_intake_for_every_policy():
    tr = trace((0, 100), (1, 50_000))  # above the 40,000 burst: never fits
    results = simulate(tr, SimConfig(horizon=10), ["count", "lane"])
    assert [r.jobs for r in results] == [1, 1]


def test_generator_is_seeded_and_drifts():
    a = generate(3_000, mix="lognormal", drift=1.3, seed=7)
    b = generate(3_000, mix="lognormal", drift=1.3, seed=7)
    assert a.est == b.est and a.actual == b.actual
    assert sum(a.actual) / sum(a.est) == pytest.approx(1.3, rel=0.05)
    assert a.run_key[:4] == ["r0", "r0", "r0", "r1"]
    assert generate(3_000, seed=8).est != a.est


@pytest.mark.parametrize("mix", ["bimodal", "uniform"])
def test_other_mixes(mix):
    tr = generate(500, mix=mix, seed=1, days=1)
    assert len(tr) == 500 and min(tr.est) > 0


def test_csv_round_trip_and_errors(tmp_path):
    tr = generate(20, seed=3, days=0.01)
    path = tmp_path / "t.csv"
    write_csv(tr, path)
    back = load_csv(path)
    assert back.est == tr.est and back.run_key == tr.run_key
    bad = tmp_path / "bad.csv"
    bad.write_text("arrival_s,stage,est,actual\n0,s,abc,1\n")
    with pytest.raises(TraceError, match=r"line 2: est='abc'"):
        load_csv(bad)
    bad.write_text("arrival_s,stage,est\n0,s,1\n")
    with pytest.raises(TraceError, match="missing column"):
        load_csv(bad)


def test_config_errors_name_field_and_value():
    with pytest.raises(ValueError, match="ceiling=0"):
        SimConfig(ceiling=0)
    with pytest.raises(ValueError, match="start_fraction=1.5"):
        SimConfig(start_fraction=1.5)


def test_percentile_nearest_rank():
    assert percentile([5, 1, 3, 2, 4], 0.5) == 3
    assert percentile(list(range(1, 101)), 0.99) == 99
    assert math.isnan(percentile([], 0.5))


def test_summary_is_json():
    (res,) = simulate(generate(200, seed=2, days=0.05), SimConfig(), ["lane"])
    doc = json.loads(json.dumps(res.summary()))
    assert doc["policy"] == "lane" and doc["jobs"] == 200


@pytest.mark.parametrize("policy", ["lane", "token-fifo"])
def test_a_finished_run_is_freed_by_refcounting_not_left_to_a_collector_pass(policy):
    # The lane queue and run book pointed back at their Sim: a cycle the cyclic collector freed in one pass over
    # every object of the run, 0.3-0.5 cpu-s of the chained week, once simulate() turned it back on.
    import gc
    import weakref

    from lane_plugin.sim.engine import Sim

    trace = generate(400, seed=3, days=0.05)
    enabled = gc.isenabled()
    gc.disable()
    try:
        sim = Sim(trace, SimConfig(), policy)
        gone = weakref.ref(sim)
        queue = weakref.ref(sim.lane_queue) if sim.lane_queue is not None else None
        result = sim.run()
        del sim
        assert gone() is None and (queue is None or queue() is None)
    finally:
        if enabled:
            gc.enable()
    assert result.jobs == 400 and result.done > 0
