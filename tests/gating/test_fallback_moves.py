"""A job a tick moves to its fallback lane is admitted there, and the gate's lines say where a job went.

A tick moves a waiting job that cannot fit before the next reset to its fallback lane; its waiter used to
go on ticking the lane it left, so the job waited in ``paid`` for ever. A waiting line written for a job
that had just been leased read ``position 0 of 0 waiting``.
"""

from __future__ import annotations

import logging
import time

import pytest
from prefect import flow

from lane_plugin import Ledger, lane_task
from lane_plugin.gating import tokenlog

from ..tables import job_rows


def tiny(led: Ledger, **kw):
    settings = dict(allowance=1000, ceiling=1000, start_fraction=1.0, burst_tokens=1000, max_leased=5, fallback="paid")
    return led.set_lane("tiny", **{**settings, **kw})


@lane_task(stage="summary", estimate=300, lane="tiny", fallback=True)
def summary(n: int):
    return n * 10


@pytest.mark.usefixtures("prefect_server")
@pytest.mark.timeout(60)
def test_a_job_a_tick_moves_to_its_fallback_lane_is_admitted_there(ledger):
    tiny(ledger)
    spent = ledger.submit("earlier", 800, "tiny")
    ledger.settle(ledger.tick("tiny")[0], 800)  # 200 left and no period: a 300-token job never fits again

    @flow
    def f():
        return summary(4)

    t0 = time.monotonic()
    assert f() == 40
    assert time.monotonic() - t0 < 20  # (it waited in paid until the test timed out)
    [job] = job_rows(ledger, "stage = 'summary'")
    assert (job["lane"], job["state"], job["actual"]) == ("paid", "done", 40) and spent != job["id"]
    assert ledger.lane("paid").spent == 40 and ledger.lane("tiny").spent == 800
    assert ledger.audit() == []


def test_a_waiting_line_for_a_job_that_left_the_queue_says_where_it_went(tmp_path, caplog):
    led = Ledger(f"sqlite:///{tmp_path / 'l.db'}")
    tiny(led)
    logger = logging.getLogger("lane_plugin.test_fallback_moves")
    logger.setLevel(logging.INFO)
    leased = led.submit("s", 100, "tiny")
    led.tick("tiny")  # leased by a tick its waiter has not seen yet
    parked = led.submit("s", 100, "tiny")
    led.park(parked, "admission deadline of 30s passed")
    with caplog.at_level(logging.INFO, logger=logger.name):
        tokenlog.waiting(logger, led, stage="s", job_id=leased, waited=1.0)
        tokenlog.waiting(logger, led, stage="s", job_id=parked, waited=30.0)
    lines = [r.getMessage() for r in caplog.records if r.name == logger.name]
    assert "position 0" not in caplog.text and "of 0 waiting" not in caplog.text
    assert lines[0].startswith("lane gate: s job leased in lane 'tiny' after waiting 1.0s (attempt 1)"), lines
    assert lines[1] == "lane gate: s job parked in lane 'tiny' after waiting 30.0s: admission deadline of 30s passed"
    assert led.wait_status(parked)["reason"] == "admission deadline of 30s passed"
    led.close()


def test_the_admitted_line_names_the_lane_it_fell_back_from(tmp_path, caplog):
    led = Ledger(f"sqlite:///{tmp_path / 'l.db'}")
    logger = logging.getLogger("lane_plugin.test_fallback_moves")
    logger.setLevel(logging.INFO)
    with caplog.at_level(logging.INFO, logger=logger.name):
        tokenlog.admitted(
            logger, led, stage="s", lane="paid", est=300, waited=1.5, attempt=1, job_id="j1", asked="tiny"
        )
        tokenlog.admitted(
            logger, led, stage="s", lane="free", est=300, waited=0.0, attempt=1, job_id="j2", asked="free"
        )
    first, second = (r.getMessage() for r in caplog.records if r.name == logger.name)
    assert first.startswith("lane gate: s admitted in lane 'paid' (the fallback of lane 'tiny') after waiting 1.50s")
    assert second.startswith("lane gate: s admitted in lane 'free' after waiting 0.00s")
    led.close()
