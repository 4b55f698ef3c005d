"""The scheduled flows, run on a Prefect test server: drift report, park_overdue, lane status.

They are loaded through their deployment entrypoints (``flows/x.py:flow``), so a
broken entrypoint fails here before it fails on a schedule.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from lane_plugin import Ledger
from lane_plugin.estimators import Constant, calibrated, submit_kwargs
from lane_plugin.reports import drift

from ..tables import ARTICLE_SQL

pytestmark = pytest.mark.prefect
ROOT = Path(__file__).resolve().parents[2]


def load(entrypoint: str):
    from prefect.flows import load_flow_from_entrypoint

    return load_flow_from_entrypoint(str(ROOT / entrypoint))


@pytest.fixture
def events(monkeypatch):
    """Every Prefect event emitted during the test, validated by Prefect's own client."""
    from prefect.events.clients import AssertingEventsClient
    from prefect.events.worker import EventsWorker

    worker = EventsWorker.instance(AssertingEventsClient)
    monkeypatch.setattr(EventsWorker, "instance", lambda *_: worker)

    def drained():
        worker.wait_until_empty()  # flushed, but still running for the next flow call
        return list(worker._client.events)

    yield drained
    worker.drain()


@pytest.fixture
def url(tmp_path):
    return f"sqlite:///{tmp_path / 'lane.db'}"


@pytest.fixture
def led(url):
    led = Ledger(url)
    led.set_lane("free", allowance=10**9, ceiling=10**9, burst_tokens=10**9, max_leased=100_000)
    yield led
    led.close()


def latest(key: str):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey
    from prefect.client.schemas.sorting import ArtifactSort

    with get_client(sync_client=True) as client:
        arts = client.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key])), sort=ArtifactSort.CREATED_DESC, limit=1
        )
    assert arts, f"no artifact {key!r}"
    return arts[0]


def settle_batch(led, stage, n, bias, rng, estimators=None):
    base, shadows = estimators or (Constant({stage: 1000}), [])
    ids = [led.submit(stage, **submit_kwargs(base, shadows, stage=stage)) for _ in range(n)]
    led.tick("free")
    for jid in ids:
        led.settle(jid, max(0, int(1000 * bias * rng.lognormvariate(0, 0.2))))


def test_drift_report_publishes_table_summary_plot_and_high_events(prefect_server, led, url, tmp_path, events):
    rng = random.Random(3)
    base = Constant({"draft": 1000, "review": 1000})
    cal = calibrated(base, factors={"draft": 1.8})
    settle_batch(led, "draft", 40, 1.8, rng, (base, [cal]))
    settle_batch(led, "review", 20, 1.0, rng, (base, [cal]))
    expected = drift(led).set_index("stage")
    flow = load("flows/drift_report.py:drift_report")
    rows = flow(db=url, since="1h", plot=str(tmp_path / "drift.png"))

    table = json.loads(latest("lane-drift").data)
    assert table == rows
    got = {r["stage"]: r for r in table}
    _, article = led.rows(ARTICLE_SQL)
    for stage, jobs, est_tokens, actual_tokens, d in article:
        assert (got[stage]["jobs"], got[stage]["est_tokens"], got[stage]["actual_tokens"], got[stage]["drift"]) == (
            jobs,
            est_tokens,
            actual_tokens,
            d,
        )
        assert got[stage]["p90"] == expected.loc[stage, "p90"]
    assert got["draft"]["drift"] > 1.5 and 0.85 < got["review"]["drift"] < 1.15

    summary = latest("lane-drift-summary").data
    assert "**Worst overspender: draft" in summary and "Fix the estimator before you touch the ceiling" in summary
    # short verdicts in the table, the explanation below it, and no path that only exists on the worker
    assert summary.index("| overspends |") < summary.index("How to read this")
    assert str(tmp_path) not in summary and str(tmp_path) not in latest("lane-drift-plot").data
    assert cal.version in summary  # the shadow that would fix it, compared on the same jobs
    assert "data:image/png;base64," in latest("lane-drift-plot").data
    assert (tmp_path / "drift.png").read_bytes()[:4] == b"\x89PNG"

    high = [e for e in events() if e.event == "lane.drift.high"]
    assert [e.resource.id for e in high] == ["lane.stage.draft"]
    assert high[0].payload["drift"] == got["draft"]["drift"] and high[0].payload["threshold"] == 1.5


def test_drift_report_on_an_empty_ledger_says_so(prefect_server, url, tmp_path):
    rows = load("flows/drift_report.py:drift_report")(db=url, plot="")
    assert rows == []
    assert "nothing to report yet" in latest("lane-drift-summary").data
    assert f"No settled jobs in the ledger at {url}" in latest("lane-drift-summary").data


def test_park_overdue_flow_reaps_parks_expires_and_publishes_the_counter(prefect_server, led, url, events):
    led.set_lane("free", lease_seconds=0.001, max_attempts=1, park_seconds=3600)
    lost = led.submit("draft", 100)
    led.tick("free")  # leased, never settled: its lease expires at once and its attempts are spent
    late = [led.submit("draft", 100, deadline=led.now() - 1) for _ in range(3)]
    led.set_lane("free", stopped=True)  # nothing gets admitted while we look
    flow = load("flows/park_overdue.py:park_overdue")
    out = flow(db=url, tail_alert=2)
    assert out == {"rolled": [], "requeued": 0, "parked": 4, "expired": 0, "tail": 4}
    assert {t["job_id"] for t in led.tail()} == {lost, *late}

    status = {r["lane"]: r for r in json.loads(latest("lane-status").data)}
    assert status["free"]["parked"] == 4 and status["free"]["state"] == "STOPPED"
    progress = latest("lane-free-ceiling")
    assert progress.type == "progress" and float(progress.data) == 0.0

    evs = events()
    parked = [e for e in evs if e.event == "lane.job.parked"]
    assert sorted(e.payload["job_id"] for e in parked) == sorted([lost, *late])
    assert [e.payload["parked"] for e in evs if e.event == "lane.tail.high"] == [4]

    # a second run finds nothing left to move: each job was parked once
    assert flow(db=url)["parked"] == 0
    # their tail deadline passes: the parked jobs fail, with lane.job.expired
    led.db.transaction(lambda cur: cur.execute("update tail set deadline = 0"))
    extra = led.submit("draft", 100, deadline=led.now() - 1)
    out = flow(db=url, max_events=2)
    assert out["parked"] == 1 and out["tail"] == 1  # parked now, with an hour to go
    expired = [e for e in events() if e.event == "lane.job.expired"]
    assert len(expired) == 2  # capped by max_events; the count is in the result
    assert out["expired"] == 4 and led.job(lost)["state"] == "failed"
    assert led.job(extra)["state"] == "parked"


def test_park_overdue_flow_rolls_periods(prefect_server, led, url):
    led.set_lane("free", period="daily")
    j = led.submit("draft", 100)
    led.tick("free")
    led.settle(j, 150)
    led.db.transaction(lambda cur: cur.execute("update lane set period_start = period_start - 86400"))
    out = load("flows/park_overdue.py:park_overdue")(db=url)
    assert out["rolled"] == ["free"]
    assert led.lane("free").spent == 0


def test_lane_status_flow(prefect_server, led, url, events):
    led.set_lane("free", ceiling=10_000, allowance=10_000, start_fraction=0.8)  # the article's flat stop, an option
    j = led.submit("draft", 2000)
    led.tick("free")
    led.settle(j, 2500)
    led.submit("draft", 3000)
    led.tick("free")
    rows = load("flows/lane_status.py:lane_status")(db=url)
    free = {r["lane"]: r for r in rows}["free"]
    assert (free["spent"], free["reserved"], free["pct_of_ceiling"], free["parked"]) == (2500, 3000, 55.0, 0)
    assert float(latest("lane-free-ceiling").data) == 55.0
    assert {r["lane"] for r in json.loads(latest("lane-status").data)} >= {"free", "paid"}
    assert not [e for e in events() if e.event == "lane.tail.high"]
    # status events only on a state change: 55% of the ceiling is "ok", and a lane first seen ok says nothing
    assert not [e for e in events() if e.resource.id.startswith("lane.") and "lane.state" in e.resource]
    led.submit("draft", 2500)  # 8,000 committed: the 8,000 start limit reached
    led.tick("free")
    load("flows/lane_status.py:lane_status")(db=url)
    load("flows/lane_status.py:lane_status")(db=url)  # the second run sees no change: no second event
    changes = [e for e in events() if "lane.state" in e.resource]
    assert [(e.event, e.resource["lane.state"]) for e in changes] == [
        ("lane.free.crossed-80%-of-its-ceiling", "finishing-only")
    ]
    led.set_lane("free", ceiling=10_000, allowance=100_000, start_fraction=1.0)
    load("flows/park_overdue.py:park_overdue")(db=url)  # either flow tells what it sees first
    changes = [e for e in events() if "lane.state" in e.resource]
    assert changes[-1].event == "lane.free.is-admitting-new-runs-again" and len(changes) == 2


def test_drift_report_refits_the_learned_estimators(prefect_server, led, url):
    from lane_plugin.estimators import learned

    base = Constant({"draft": 1000})
    est = learned("gpt-4o", ledger=led)
    rng = random.Random(5)
    ids = [led.submit("draft", **submit_kwargs(base, [est], "Summarise the report.", stage="draft")) for _ in range(30)]
    led.tick("free")
    outputs = [int(600 * rng.lognormvariate(0, 0.3)) for _ in ids]
    for jid, out in zip(ids, outputs):
        led.settle(jid, led.job(jid)["est_input"] + out)
    assert led.estimator_state() == []
    load("flows/drift_report.py:drift_report")(db=url, plot="")
    [row] = led.estimator_state("learned")
    assert row["stage"] == "draft" and row["jobs"] == 30 and abs(row["allowance"] - sum(outputs) / 30) <= 0.5
    est.sync(force=True)
    assert est.version.endswith("#" + row["revision"]) and row["revision"] != "00000000"
