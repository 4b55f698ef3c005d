"""Waiting, deadlines, fallback, the 80% rule, races, lease loss and events through real flows."""

from __future__ import annotations

import logging
import threading
import time

import pytest
from prefect import flow
from prefect.task_runners import ThreadPoolTaskRunner

from lane_plugin import Gate, JobParked, Ledger, NeverFits, lane_task, report_usage

from ..tables import job_rows, settlements

pytestmark = [pytest.mark.usefixtures("prefect_server"), pytest.mark.timeout(120)]


def tiny(ledger, name="tiny", **kw):
    settings = dict(allowance=1000, ceiling=1000, start_fraction=1.0, burst_tokens=1000, max_leased=5)
    return ledger.set_lane(name, **{**settings, **kw})


def hog(ledger, lane, est):
    """Hold ``est`` tokens of ``lane`` with a lease nobody settles during the test."""
    job = ledger.submit("hog", est, lane)
    assert [lease.job_id for lease in ledger.tick(lane)] == [job]
    return job


@lane_task(stage="summary", estimate=300, lane="tiny", deadline=0.5, retries=2)
def patient(n: int):
    return n * 10


@lane_task(stage="summary", estimate=300, lane="tiny", deadline=0.3, fallback="paid")
def with_fallback(n: int):
    return n * 10


def test_deadline_parks_the_job_and_fails_with_jobparked(ledger):
    tiny(ledger)
    hog(ledger, "tiny", 800)

    @flow
    def f():
        return patient(7)

    t0 = time.monotonic()
    state = f(return_state=True)
    with pytest.raises(JobParked) as err:
        state.result()
    assert time.monotonic() - t0 < 15  # one deadline, not three: a parked job is not retried
    msg = str(err.value)
    assert "lane 'tiny'" in msg and "estimate 300 tokens" in msg and "200 tokens remained" in msg
    [job] = job_rows(ledger, "stage = 'summary'")
    assert job["state"] == "parked" and job["attempt"] == 1
    assert [t["job_id"] for t in ledger.tail()] == [job["id"]]
    assert ledger.audit() == []


def test_fallback_lane_admits_the_job_past_its_deadline(ledger):
    tiny(ledger)
    hog(ledger, "tiny", 800)

    @flow
    def f():
        return with_fallback(4)

    assert f() == 40
    [job] = job_rows(ledger, "stage = 'summary'")
    assert (job["lane"], job["state"], job["actual"]) == ("paid", "done", 40)
    assert ledger.lane("paid").spent == 40 and ledger.lane("tiny").spent == 0
    assert ledger.audit() == []


@lane_task(stage="huge", estimate=5000, lane="tiny", retries=3)
def huge():
    return 1


def test_a_job_that_can_never_fit_fails_at_once_with_the_reason(ledger):
    tiny(ledger)

    @flow
    def f():
        return huge()

    t0 = time.monotonic()
    state = f(return_state=True)
    with pytest.raises(NeverFits, match="exceeds the lane's burst of 1000"):
        state.result()
    assert time.monotonic() - t0 < 10 and job_rows(ledger) == []


@lane_task(stage="outline", estimate=450, lane="half", deadline=0.5)
def outline(doc: str):
    return 450


@lane_task(stage="expand", estimate=300, lane="half", deadline=0.5)
def expand(doc: str):
    return 300


@lane_task(stage="note", estimate=100, lane="half", deadline=0.5)
def note(doc: str):
    return 100


def test_a_started_flow_run_finishes_its_later_stages_past_the_start_limit(ledger):
    tiny(ledger, "half", start_fraction=0.5)  # start limit 500 of a 1000 ceiling

    @flow
    def pipeline(doc: str):
        outline(doc)
        return expand(doc)  # 450 + 300 > 500, but this run already started: admitted

    @flow
    def another(doc: str):
        return note(doc)  # 750 + 100 fits the ceiling, but a new run may not start past 500

    assert pipeline("d") == 300
    second = another("e", return_state=True)
    with pytest.raises(JobParked, match="start limit 500"):  # parked at once: spend alone leaves no room
        second.result()
    assert ledger.lane("half").spent == 750
    assert ledger.audit() == []


@lane_task(stage="race", estimate=150, lane="tiny", deadline=3.0)
def racer(i: int):
    time.sleep(0.05)
    return {"usage": {"total_tokens": 140 + i % 3 * 10}}


def test_two_flows_racing_on_a_tiny_lane_never_overspend(ledger):
    tiny(ledger, max_leased=2)

    @flow(task_runner=ThreadPoolTaskRunner(max_workers=4))
    def burst(n: int):
        futures = racer.map(range(n))
        return [f.state for f in futures.wait() or futures]

    results = []
    threads = [threading.Thread(target=lambda: results.append(burst(6, return_state=True))) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert len(results) == 2
    lane = ledger.lane("tiny")
    done = [j for j in job_rows(ledger) if j["state"] == "done"]
    parked = [j for j in job_rows(ledger) if j["state"] == "parked"]
    assert lane.spent <= lane.ceiling and lane.reserved == 0 and lane.leased == 0
    assert lane.spent == sum(j["actual"] for j in done) == sum(s["actual"] for s in settlements(ledger))
    assert len(done) + len(parked) == 12 and len(done) >= 5  # 5 x 150 fit; what would overspend parks
    assert ledger.audit() == []


@lane_task(stage="slow", estimate=600, lane="tiny", deadline=10)
def waits_for_room():
    return 600


def test_the_wait_is_logged_with_its_numbers_and_ends_when_room_appears(ledger, caplog):
    caplog.set_level(logging.INFO, logger="prefect.task_runs")
    tiny(ledger)
    blocker = hog(ledger, "tiny", 700)

    def free_room_once_it_waited():
        # Settle the blocker 2 s after the gated job is seen waiting (its first wait log is
        # due after 1 s), however long the flow takes to start on a busy machine.
        own = Ledger(ledger.url.raw)
        end = time.monotonic() + 60
        while time.monotonic() < end and not own.rows("select id from job where state = 'new'")[1]:
            time.sleep(0.05)
        time.sleep(2.0)
        own.settle(blocker, 300)

    threading.Thread(target=free_room_once_it_waited, daemon=True).start()

    @flow
    def f():
        return waits_for_room()

    t0 = time.monotonic()
    assert f() == 600
    assert 1.9 < time.monotonic() - t0 < 30
    waits = [r.getMessage() for r in caplog.records if "waiting" in r.getMessage()]
    assert waits, caplog.text
    assert "estimate 600, remaining 300 of ceiling 1000" in waits[0] and "position 1 of 1" in waits[0]
    assert "blocked by ceiling" in waits[0]
    polls = ledger.rows("select count(*) from job")  # sanity: the ledger is readable after the wait
    assert polls[1][0][0] == 2
    assert ledger.audit() == []


@lane_task(stage="long", estimate=100, lane="short-lease")
def loses_its_lease(url: str):
    report_usage(80)
    Ledger(url, clock=lambda: time.time() + 3600).reap()  # as if the lease had expired long ago
    time.sleep(0.5)  # the renewer (every lease_seconds / 3) finds the lease gone
    return 20


def test_a_lost_lease_is_logged_loudly_and_its_tokens_still_billed(ledger, caplog):
    caplog.set_level(logging.ERROR, logger="prefect.task_runs")
    tiny(ledger, "short-lease", lease_seconds=0.3)

    @flow
    def f():
        return loses_its_lease(ledger.url.raw)

    assert f() == 20
    assert "LEASE LOST" in caplog.text and "lost its lease while running" in caplog.text
    [s] = settlements(ledger)
    assert (s["actual"], s["late"]) == (100, 1)
    lane = ledger.lane("short-lease")
    assert (lane.spent, lane.reserved, lane.leased) == (100, 0, 0)
    [job] = job_rows(ledger)
    assert job["state"] == "parked"  # the requeued attempt has nobody to run it
    assert ledger.audit() == []


def test_ledger_events_become_prefect_events(ledger, monkeypatch):
    import prefect.events

    seen = []
    monkeypatch.setattr(prefect.events, "emit_event", lambda **kw: seen.append(kw))
    tiny(ledger, start_fraction=0.5)

    @lane_task(stage="ev", estimate=300, lane="tiny", deadline=0.3)
    def ev(n):
        return 300

    @flow
    def f():
        ev(1)
        ev(2)  # crosses the 500 start limit: "lane tiny crossed 50% of its ceiling"

    f()

    @flow
    def g():
        ev(3)  # a new run past the start limit: parked

    g(return_state=True)
    names = [e["event"] for e in seen]
    assert names.count("lane.job.admitted") == 2 and names.count("lane.job.settled") == 2
    assert "lane.job.parked" in names and "lane.lane.start-stop" not in names
    # the lane's state change is told once, named in words (the UI's title), with a label to match on
    [stop] = [e for e in seen if e["event"].startswith("lane.tiny.")]
    assert stop["event"] == "lane.tiny.crossed-50%-of-its-ceiling"
    assert stop["resource"]["prefect.resource.id"] == "lane.tiny" and stop["resource"]["lane.state"] == "finishing-only"
    assert stop["payload"]["start_limit"] == 500 and stop["payload"]["committed"] == 600
    settled = next(e for e in seen if e["event"] == "lane.job.settled")
    assert settled["payload"]["actual"] == 300 and settled["payload"]["lane"] == "tiny"
    # the job's numbers are resource labels, which the Prefect UI's event card shows
    assert settled["resource"]["lane.estimate"] == "300" and settled["resource"]["lane.actual"] == "300"
    admitted = next(e for e in seen if e["event"] == "lane.job.admitted")
    assert admitted["resource"]["lane.estimate"] == "300" and admitted["resource"]["lane.stage"] == "ev"
    assert admitted["resource"]["lane.tenant"] == admitted["payload"]["tenant"] != ""  # its flow's name

    # and the card (which shows a related resource of an unknown type by its id) reads them
    def card(e):
        return [r["prefect.resource.id"] for r in e["related"] if r["prefect.resource.role"] == "lane-tokens"]

    assert card(settled) == ["lane.tokens: tiny, estimate 300 tokens, actual 300"]  # a settlement names no stage
    assert card(admitted) == ["lane.tokens: tiny: ev, estimate 300 tokens"]
    assert settled["resource"]["prefect.resource.id"] == "lane.tiny"  # still the lane's resource


def test_a_restart_of_the_same_attempt_is_the_same_job(ledger):
    first = Gate("draft", 100, key="task-run-1", attempt=1)
    first.__enter__()  # the worker dies here, holding the lease
    again = Gate("draft", 100, key="task-run-1", attempt=1)
    with again:
        again.report(90)
    assert again.job_id == first.job_id and len(job_rows(ledger)) == 1
    # the same job, as its next attempt: the dead run's lease is voided, never shared (issue 10 item 11:
    # a shared lease let two live runs settle one attempt and dropped the second's tokens)
    assert (first.lease.attempt, again.lease.attempt) == (1, 2) and first.lease.token != again.lease.token
    assert [(s["attempt"], s["actual"]) for s in settlements(ledger)] == [(2, 90)]
    from lane_plugin.gating.context import _current
    from lane_plugin.gating.renewal import renewer

    renewer().release(first._held)
    _current.reset(first._token)  # the "dead" first gate never exits: undo its context
    first._shield.close()  # and leave Prefect's timeout shield of this thread as it found it
    assert ledger.audit() == []


class Words:
    name = "words"
    version = "words-v2"

    def estimate(self, text: str, stage: str | None = None) -> int:
        return 10 * len(text.split()) + (50 if stage == "est" else 0)


@lane_task(stage="est", estimate=Words())
def with_estimator(text: str):
    return 7


def test_an_estimator_object_sets_est_and_est_version(ledger):
    @flow
    def f():
        return with_estimator("three small words")

    f()
    [job] = job_rows(ledger)
    assert (job["est"], job["est_version"]) == (80, "words-v2")
