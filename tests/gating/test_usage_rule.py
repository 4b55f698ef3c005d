"""One rule for every count a body gives the gate (issue 22, item 6), on SQLite and PostgreSQL.

An int of any kind (``int``, numpy's integers, an integral ``Decimal`` or float) is tokens, whichever
way it arrives: ``report()`` / ``report_usage()``, the return value, a ``usage=`` result, a stream.
Anything else (a bool, NaN, 50.7, -5, text, past 10**12) is refused *at the call that gave it*: a
warning names the value, nothing of it is counted, what was validly reported before it stays, and the
block bills at least its estimate (``by_estimate``). A bad count never fails the task and never bills 0.

Before: ``report(5000); report(10**13)`` billed 100 (the estimate replaced the whole sum at settlement);
``g.report(np.int64(50))`` / ``Decimal("50")`` / ``50.7`` / ``True`` failed the block and billed 0; a
``usage=`` result of ``np.int64(60)`` (or -5, NaN) failed the task (never retried) and billed 0; a task
returning ``np.int64(60)`` billed its estimate; ``gate()`` refused an estimate of ``np.int64(100)``.
"""

from __future__ import annotations

import contextvars
import logging
import math
import re
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal
from fractions import Fraction

import numpy as np
import pytest

from lane_plugin import InvalidInput, LaneError, Ledger, current_gate, gate, lane_task, report_usage
from lane_plugin.gating.usage_meter import UsageMeter

from ..conftest import PgSchema, postgres_or_skip
from ..tables import job_rows, settlements

EST = 100
WHOLE = [
    np.int64(50),
    np.int32(50),
    np.uint16(50),
    Decimal("50"),
    Decimal("5E+1"),
    50.0,
    np.float64(50.0),
    Fraction(100, 2),
]
BAD = [  # (value, what the warning says of it)
    (True, "invalid usage True: a bool is not a count of tokens"),
    (np.True_, "invalid usage np.True_: a bool is not a count of tokens"),
    (math.nan, "invalid usage nan: not a finite number"),
    (math.inf, "invalid usage inf: not a finite number"),
    (50.7, "invalid usage 50.7: not a whole number of tokens"),
    (Decimal("50.5"), "invalid usage Decimal('50.5'): not a whole number of tokens"),
    (Decimal("NaN"), "invalid usage Decimal('NaN'): not a finite number"),
    (-5, "invalid usage -5: negative (expected at least 0)"),
    (np.int64(-5), "invalid usage np.int64(-5): negative (expected at least 0)"),
    (10**13, "invalid usage 10000000000000: absurdly large"),
    (2**62, "invalid usage 4611686018427387904: absurdly large"),
    (Decimal("1E+400"), "invalid usage Decimal('1E+400'): absurdly large"),
    ("50", "invalid usage '50': no token count found"),
    (None, "invalid usage None: no token count found"),
]


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def led(request, tmp_path_factory):
    """One ledger per database for the module (a PostgreSQL schema costs seconds to migrate); each test
    bills its own lane, so each checks only its own numbers and the whole ledger stays auditable."""
    schema = None
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path_factory.mktemp('rule') / 'lane.db'}"
    else:
        schema = PgSchema(postgres_or_skip())
        url = schema.url
    ledger = Ledger(url)
    yield ledger
    ledger.close()
    if schema is not None:
        schema.drop()


@pytest.fixture
def lane(led, request) -> str:
    name = request.node.originalname.removeprefix("test_")[:60]
    led.set_lane(name, allowance=10**12, ceiling=10**12)
    return name


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


def _settled(led, stage: str) -> tuple[int, bool, str]:
    [job] = job_rows(led, "stage = :s", {"s": stage})  # each test's stages are its own
    [s] = [s for s in settlements(led) if s["job_id"] == job["id"]]
    assert job["actual"] == s["actual"]
    return s["actual"], bool(s["by_estimate"]), job["state"]


def _block(led, lane: str, *reports, est: int = EST, stage: str = "s"):
    with gate(stage=stage, estimate=est, lane=lane, ledger=led) as g:
        totals = [g.report(r) for r in reports]
    return g, totals


# -- report(): refused at its call, never erasing what came before ------------------------------
def test_a_report_past_the_cap_is_refused_at_its_call_and_the_valid_one_is_billed(led, lane, caplog):
    with caplog.at_level(logging.WARNING, logger="lane_plugin.gate"):
        g, totals = _block(led, lane, 5000, 10**13, stage="drop")
    assert totals == [5000, 5000]  # refused at the second call: the total never held 10**13
    assert (g.settled.actual, g.settled.by_estimate, g.settled.outcome) == (5000, True, "done")
    assert _settled(led, "drop") == (5000, True, "done")
    said = _warnings(caplog)
    assert any("invalid usage 10000000000000: absurdly large" in w and "(from report_usage())" in w for w in said)
    g, totals = _block(led, lane, 2**62, 2**62, stage="huge")  # nothing valid: the estimate, never 0
    assert totals == [0, 0] and g.settled.actual == EST and g.settled.by_estimate
    assert led.lane(lane).reserved == 0 and led.audit() == []


def test_integers_of_every_kind_are_tokens(led, lane, caplog):
    with caplog.at_level(logging.WARNING, logger="lane_plugin.gate"):
        for i, n in enumerate(WHOLE):
            g, _ = _block(led, lane, n, stage=f"whole{i}")
            assert (g.settled.actual, g.settled.by_estimate) == (50, False), n
            assert _settled(led, f"whole{i}") == (50, False, "done")
    assert _warnings(caplog) == []
    assert led.lane(lane).spent == 50 * len(WHOLE) and led.audit() == []


def test_a_bad_count_is_refused_naming_it_and_bills_the_estimate_or_the_valid_reports(led, lane, caplog):
    for i, (bad, says) in enumerate(BAD):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="lane_plugin.gate"):
            g, totals = _block(led, lane, bad, stage=f"alone{i}")  # never raises: the provider served the call
            assert totals == [0] and _settled(led, f"alone{i}") == (EST, True, "done"), bad
            g, totals = _block(led, lane, 30, bad, est=10, stage=f"after{i}")  # what came before stays
            assert totals == [30, 30] and _settled(led, f"after{i}") == (30, True, "done"), bad
        said = _warnings(caplog)
        assert sum(says in w and "(from report_usage())" in w for w in said) == 2, (bad, said)
        if isinstance(bad, int) and bad < 0:
            assert not any("no token count found" in w for w in said), said  # -5 is said to be negative
    assert led.lane(lane).reserved == 0 and led.audit() == []


def test_a_failing_body_after_a_refused_count_bills_the_estimate_and_keeps_its_error(led, lane):
    with pytest.raises(RuntimeError, match="boom"):
        with gate(stage="fails", estimate=EST, lane=lane, ledger=led) as g:
            g.report(50.7)
            raise RuntimeError("boom")
    assert _settled(led, "fails") == (EST, True, "failed")


def test_a_stream_counts_numpy_figures_and_refuses_a_bad_one(led, lane, caplog):
    def chunk(cid: str, total):
        return {"object": "chat.completion.chunk", "id": cid, "choices": [], "usage": {"total_tokens": total}}

    with gate(stage="stream", estimate=EST, lane=lane, ledger=led) as g:
        assert list(g.track(iter([chunk("a", None), chunk("a", np.int64(70))]))) != []
    assert _settled(led, "stream") == (70, False, "done")
    with caplog.at_level(logging.WARNING, logger="lane_plugin.gate"):
        with gate(stage="badstream", estimate=EST, lane=lane, ledger=led) as g:
            list(g.track(iter([chunk("b", 30.5)])))
    assert _settled(led, "badstream") == (EST, True, "done")
    assert any("invalid total_tokens 30.5" in w and "(from a tracked stream)" in w for w in _warnings(caplog))


# -- estimates: lane_task and gate() take the same ones ------------------------------------------
@pytest.mark.parametrize("estimate", [100, np.int64(100), np.uint32(100), Decimal("100"), 100.0, Fraction(200, 2)])
def test_lane_task_and_gate_accept_the_same_token_counts(estimate):
    assert gate(stage="s", estimate=estimate).est == 100
    assert lane_task(stage="s", estimate=estimate)(lambda: None).lane_spec.estimate is estimate


@pytest.mark.parametrize(
    "estimate, says",
    [
        (True, "a bool is not a count of tokens"),
        (0, "expected at least 1"),
        (50.5, "not a whole number"),
        (np.int64(-1), "negative"),
        (10**13, "absurdly large"),
        ("100", "expected a token count"),
    ],
)
def test_lane_task_and_gate_refuse_the_same_estimates_naming_them(estimate, says):
    for make in (lambda: gate(stage="s", estimate=estimate), lambda: lane_task(stage="s", estimate=estimate)):
        with pytest.raises(InvalidInput, match=re.escape(f"invalid estimate {estimate!r}: ") + f".*{says}"):
            make()


# -- the meter: one total, whatever thread reports -----------------------------------------------
def test_reports_from_many_threads_at_once_are_all_counted():
    meter = UsageMeter()
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible: a lost update would show
    try:
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda _: [meter.add(1) for _ in range(2000)], range(8)))
    finally:
        sys.setswitchinterval(before)
    assert meter.total == 16_000


# -- lane_task: the return value, usage=, threads (one flow per database) ------------------------
def _tasks(led, lane: str) -> dict:
    def lt(stage: str, est: int = EST, **kw):
        return lane_task(stage=stage, estimate=est, lane=lane, ledger=led, lane_tags=False, **kw)

    tasks = {
        "ret_np": lt("ret_np")(lambda: np.int64(60)),
        "ret_bool": lt("ret_bool")(lambda: bool(report_usage(5))),  # a bool result is an answer, not a count
        "use_np": lt("use_np", usage=lambda r: np.int64(60))(lambda: "text"),
        "use_dec": lt("use_dec", usage=lambda r: Decimal(60))(lambda: "text"),
    }
    for name, bad in {"use_neg": -5, "use_nan": math.nan, "use_str": "lots", "use_bool": True}.items():
        tasks[name] = lt(name, usage=lambda r, bad=bad: bad)(lambda: "served")

    def reports_then_reader_raises():
        report_usage(40)
        return {"answer": "served"}

    tasks["raises"] = lt("raises", usage=lambda r: r["tokens"])(reports_then_reader_raises)
    tasks["raises_small"] = lt("raises_small", est=10, usage=lambda r: r["tokens"])(reports_then_reader_raises)

    def fanout():
        g = current_gate()
        with ThreadPoolExecutor(4) as pool:
            list(pool.map(g.report, [10] * 8))  # the gate object, handed to the threads
            ctx = [contextvars.copy_context() for _ in range(4)]  # report_usage() in a copy of the body's context
            list(pool.map(lambda c: c.run(report_usage, 7), ctx))
        said = []
        thread = threading.Thread(target=lambda: said.append(_outside_error()), name="bare-worker")
        thread.start()
        thread.join()
        return said[0]

    tasks["fanout"] = lt("fanout")(fanout)
    return tasks


class _Heard(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.said: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.said.append(record.getMessage())


def _outside_error() -> str:
    try:
        report_usage(1)
    except LaneError as exc:
        return str(exc)
    return "no error"


@pytest.mark.usefixtures("prefect_server")
@pytest.mark.timeout(120)
def test_lane_tasks_read_every_kind_of_int_and_never_fail_a_served_call_on_a_bad_count(led, lane):
    from prefect import flow

    tasks = _tasks(led, lane)

    @flow
    def all_of_them():
        return {name: t(return_state=True) for name, t in tasks.items()}

    heard = _Heard()  # on the task runs' logger itself: the harness's logging setup may drop caplog's handler
    logging.getLogger("prefect.task_runs").addHandler(heard)
    try:
        states = all_of_them()
    finally:
        logging.getLogger("prefect.task_runs").removeHandler(heard)
    assert all(s.is_completed() for s in states.values()), {n: s.type for n, s in states.items()}
    out = {name: s.result() for name, s in states.items()}
    assert out["use_neg"] == "served" and out["raises"] == {"answer": "served"}
    billed = {name: _settled(led, name) for name in tasks}
    assert billed == {
        "ret_np": (60, False, "done"),
        "ret_bool": (5, False, "done"),
        "use_np": (60, False, "done"),
        "use_dec": (60, False, "done"),
        "use_neg": (EST, True, "done"),
        "use_nan": (EST, True, "done"),
        "use_str": (EST, True, "done"),
        "use_bool": (EST, True, "done"),
        "raises": (EST, True, "done"),
        "raises_small": (40, True, "done"),  # at least the valid report
        "fanout": (8 * 10 + 4 * 7, False, "done"),
    }
    said = " | ".join(heard.said)
    for named in (
        "invalid usage -5: negative",
        "invalid usage nan",
        "invalid usage 'lots'",
        "invalid usage True",
        "the usage= callable's reading (it raised KeyError: 'tokens')",
    ):
        assert named in said, named
    assert "in thread 'bare-worker'" in out["fanout"] and "current_gate()" in out["fanout"], out["fanout"]
    assert led.lane(lane).reserved == 0 and led.audit() == []
