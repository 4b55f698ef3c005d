"""Issue 11's waits in the store, on SQLite and PostgreSQL: the lane learns a size-class boundary from
its latest estimates where it refits its finishing reserve, and every place that sets a job's place
in the order (intake, reopen, requeue, a fallback move, a settings change) places it by that boundary."""

from __future__ import annotations

import pytest

from lane_plugin.policy.reserve import REFIT_SECONDS
from lane_plugin.policy.sizeclass import SIZE_CLASS_MIN, SIZE_CLASS_SAMPLE, size_class_boundary


def lane(led, name="t", **kw):
    settings = dict(
        allowance=10**9,
        ceiling=10**9,
        burst_tokens=10_000,
        window_seconds=10.0,
        max_leased=10,
        lease_seconds=30.0,
        max_wait_seconds=100,
    )
    return led.set_lane(name, **{**settings, **kw})


def boundary(led, name="t"):
    _, [(b,)] = led.rows("select size_boundary from lane where name = :n", {"n": name})
    return b


def submit_all(led, clock, ests, name="t") -> list[str]:
    ids = []
    for e in ests:
        clock.t += 0.01
        ids.append(led.submit("s", e, name))
    return ids


def test_the_boundary_is_learned_at_the_refit_and_places_new_jobs(led, clock):
    lane(led)  # age factor: 100 s / 10,000 tokens = 0.01 s per token
    first = submit_all(led, clock, range(1, SIZE_CLASS_MIN))
    led.refit_runs("t")
    assert boundary(led) is None  # too few estimates: one continuous priority
    clock.t += 1
    unclassed = led.submit("s", 5_000, "t")
    assert led.job(unclassed)["prio"] == pytest.approx(clock.t + 5_000 * 0.01)
    submit_all(led, clock, [50])
    led.refit_runs("t")
    ests = [*range(1, 50), 5_000, 50]
    assert boundary(led) == size_class_boundary(ests) == 31
    before = {j: led.job(j)["prio"] for j in [*first, unclassed]}
    clock.t += 1
    small, big = led.submit("s", 31, "t"), led.submit("s", 32, "t")
    assert led.job(small)["prio"] == pytest.approx(clock.t)
    assert led.job(big)["prio"] == pytest.approx(clock.t + 100)
    assert {j: led.job(j)["prio"] for j in before} == before  # waiting jobs keep their place
    # a later small job goes first, within max_wait_seconds of the big one
    clock.t += 99
    later = led.submit("s", 1, "t")
    order = [led.job(j)["prio"] for j in (later, big)]
    assert order[0] < order[1]


def test_the_boundary_comes_from_the_last_sample_of_estimates_only(led, clock):
    lane(led)
    submit_all(led, clock, [9_000] * 100 + list(range(1, SIZE_CLASS_SAMPLE + 1)))
    led.refit_runs("t")
    assert boundary(led) == size_class_boundary(range(1, SIZE_CLASS_SAMPLE + 1)) == 301
    # a tick refits once REFIT_SECONDS have passed since the last refit
    submit_all(led, clock, [8_000] * 400)
    led.tick("t")
    assert boundary(led) == 301
    clock.t += REFIT_SECONDS
    led.tick("t")
    assert boundary(led) == 8_000


def test_requeue_fallback_and_settings_place_jobs_by_the_boundary(led, clock):
    lane(led, "fb", max_wait_seconds=50)
    lane(led, fallback="fb")
    submit_all(led, clock, range(1, 101), "t")
    submit_all(led, clock, range(101, 201), "fb")
    led.refit_runs("t"), led.refit_runs("fb")
    assert (boundary(led, "t"), boundary(led, "fb")) == (61, 161)
    big, small = led.submit("s", 90, "t"), led.submit("s", 10, "t")
    led.park(big), led.park(small)
    clock.t += 7
    led.requeue(big), led.requeue(small)
    assert (led.job(big)["prio"], led.job(small)["prio"]) == (pytest.approx(clock.t + 100), pytest.approx(clock.t))
    # moved to its fallback: placed by that lane's boundary and max_wait_seconds
    fb_big, fb_small = led.submit("s", 170, "t", fallback=True), led.submit("s", 150, "t", fallback=True)
    clock.t += 3
    assert led.give_up_waiting(fb_big, "deadline") == "fb" and led.give_up_waiting(fb_small, "deadline") == "fb"
    assert led.job(fb_big)["prio"] == pytest.approx(clock.t + 50)
    assert led.job(fb_small)["prio"] == pytest.approx(clock.t)
    # a change of max_wait_seconds re-places every waiting and parked job by the same boundary
    led.park(small)
    led.set_lane("t", max_wait_seconds=30)
    waiting = {j: led.job(j) for j in (big, small)}
    assert waiting[big]["prio"] == pytest.approx(waiting[big]["wait_since"] + 30)
    assert waiting[small]["prio"] == pytest.approx(waiting[small]["wait_since"])


def test_a_later_stage_of_a_run_under_way_is_placed_without_the_classes(led, clock):
    lane(led, "fb")
    lane(led, fallback="fb")
    sample = submit_all(led, clock, range(1, 101))
    submit_all(led, clock, range(1, 101), "fb")
    led.refit_runs("t"), led.refit_runs("fb")
    for j in sample:  # out of the queue: the run's first stage is the only one to lease
        led.park(j)
    first = led.submit("s1", 5, "t", run_key="run-1")
    assert [x.job_id for x in led.tick("t")] == [first]  # the run is under way
    clock.t += 1
    later, alone = led.submit("s2", 90, "t", run_key="run-1"), led.submit("s2", 90, "t", run_key="run-2")
    assert led.job(later)["prio"] == pytest.approx(clock.t + 90 * 0.01)  # continuous, though above 61
    assert led.job(alone)["prio"] == pytest.approx(clock.t + 100)  # starts a run: by class
    led.park(later)
    clock.t += 2
    led.requeue(later)
    assert led.job(later)["prio"] == pytest.approx(clock.t + 90 * 0.01)
    led.set_lane("t", max_wait_seconds=50)  # age factor 0.005
    assert led.job(later)["prio"] == pytest.approx(led.job(later)["wait_since"] + 90 * 0.005)
    assert led.job(alone)["prio"] == pytest.approx(led.job(alone)["wait_since"] + 50)
    # moved to a fallback lane where its run is not under way: placed by that lane's classes
    moved = led.submit("s2", 90, "t", run_key="run-1", fallback=True)
    clock.t += 3
    assert led.give_up_waiting(moved, "deadline") == "fb"
    assert led.job(moved)["prio"] == pytest.approx(clock.t + 100)
