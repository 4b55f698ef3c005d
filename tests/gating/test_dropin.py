"""``lane_task`` as a drop-in for ``@task`` (issue 15): one test group per incompatibility it had.

Each group names the item of the issue it covers. Prefect's own task tests, run
through ``lane_task``, are in test_prefect_suite.py (behind LANE_PREFECT_SUITE=1).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import uuid

import pytest
from prefect import Task, flow, task
from prefect.context import TaskRunContext
from prefect.tasks import task_input_hash

from lane_plugin import NO_USAGE, InvalidInput, LaneError, lane_task, report_usage
from lane_plugin.errors import UsageMissing

from ..tables import job_rows, settlements

pytestmark = [pytest.mark.usefixtures("prefect_server"), pytest.mark.timeout(120)]


def in_flow(fn):
    """Run ``fn`` as the body of a one-off flow (a lambda's name is not a valid flow name)."""
    return flow(name="drop-in")(fn)()


def states(ledger) -> list[tuple]:
    return [(j["stage"], j["actual"], j["state"], j["attempt"]) for j in job_rows(ledger)]


# -- 1. @lane_task over @classmethod / @staticmethod --------------------------------------
def test_classmethod_and_staticmethod_are_gated_with_cls_bound(ledger):
    class Documents:
        prefix = "doc"

        @lane_task(stage="cls-sync", estimate=50)
        @classmethod
        def label(cls, n: int):
            report_usage(7)
            return f"{cls.prefix}-{n}"

        @lane_task(stage="cls-async", estimate=50)
        @classmethod
        async def alabel(cls, n: int):
            report_usage(8)
            return f"{cls.prefix}-{n}"

        @lane_task(stage="static-async", estimate=50)
        @staticmethod
        async def double(n: int):
            report_usage(9)
            return [2 * n]  # a list carries no usage (a returned int would be read as tokens)

    @flow
    async def f():
        return Documents.label(1), await Documents.alabel(2), await Documents.double(3)

    assert asyncio.run(f()) == ("doc-1", "doc-2", [6])
    assert sorted(states(ledger)) == [
        ("cls-async", 8, "done", 1),
        ("cls-sync", 7, "done", 1),
        ("static-async", 9, "done", 1),
    ]
    assert Documents.label.fn.__name__ == "label" and Documents.label.isclassmethod
    assert ledger.audit() == []


# -- 2. callables without __name__ --------------------------------------------------------
class Scorer:
    def __call__(self, text: str) -> dict:
        return {"usage": {"total_tokens": len(text)}}


def score(text: str, scale: int) -> int:
    return len(text) * scale


def test_partials_and_callable_objects_are_gated_under_prefects_default_names(ledger):
    by_object = lane_task(stage="score", estimate=10)(Scorer())
    by_partial = lane_task(stage="scale", estimate=10)(functools.partial(score, scale=3))
    assert (by_object.name, by_partial.name) == ("Scorer", "partial")
    assert by_object.task_key == task(Scorer()).task_key  # Prefect's own key for a callable object

    @flow
    def f():
        return by_object("abcd"), by_partial("ab")

    assert f() == ({"usage": {"total_tokens": 4}}, 6)
    assert sorted(states(ledger)) == [("scale", 6, "done", 1), ("score", 4, "done", 1)]


# -- 3. generators and async generators ---------------------------------------------------
def test_generator_holds_its_lease_while_consumed_and_settles_once_exhausted(ledger):
    @lane_task(stage="stream", estimate=100)
    def stream(n: int):
        for i in range(n):
            report_usage(10)  # inside the generator: adds to its gate
            yield {"chunk": i, "usage": {"total_tokens": 1}}  # each yielded value's usage counts
        return {"usage": {"total_tokens": 5}}  # and the return value's

    seen = {}

    @flow
    def f():
        it = stream(3)
        first = next(it)
        seen["mid"] = states(ledger)
        with pytest.raises(LaneError, match="outside a gated block"):
            report_usage(1000)  # the consumer, between two steps, is not inside the gate
        return [first, *it]

    assert [c["chunk"] for c in f()] == [0, 1, 2]
    assert seen["mid"] == [("stream", 0, "leased", 1)]  # leased while it is consumed
    assert states(ledger) == [("stream", 3 * 11 + 5, "done", 1)]
    assert len(settlements(ledger)) == 1 and ledger.lane("free").reserved == 0
    assert ledger.audit() == []


def test_generator_closed_early_settles_what_it_used_as_done(ledger):
    @lane_task(stage="early", estimate=100)
    def stream():
        for i in range(100):
            report_usage(4)
            yield i

    @flow
    def f():
        it = stream()
        got = [next(it), next(it)]
        it.close()  # the consumer stops early
        return got

    assert f() == [0, 1]
    assert states(ledger) == [("early", 2 * 4 + 0 + 1, "done", 1)]  # yielded ints are tokens, like returned ints
    assert ledger.lane("free").leased == 0 and ledger.audit() == []


def test_generator_that_raises_settles_failed_with_what_it_reported_and_retries(ledger):
    calls = {"n": 0}

    @lane_task(stage="flaky-stream", estimate=100, retries=1, retry_delay_seconds=0, usage=lambda v: None)
    def stream():
        calls["n"] += 1
        report_usage(30)
        yield "a"
        if calls["n"] == 1:
            raise RuntimeError("provider hiccup mid-stream")
        yield "b"

    @flow
    def f():
        return list(stream())

    assert f() == ["a", "a", "b"]  # Prefect re-runs the generator from the start on retry
    rows = [(s["attempt"], s["actual"], s["outcome"]) for s in settlements(ledger)]
    assert rows == [(1, 30, "failed"), (2, 30, "done")]
    assert ledger.audit() == []


def test_async_generator_settles_on_exhaustion_and_on_early_close(ledger):
    @lane_task(stage="astream", estimate=100)
    async def astream(n: int):
        for i in range(n):
            await asyncio.sleep(0)
            report_usage(5)
            yield {"i": i}

    @flow
    async def f():
        full = [x async for x in astream(3)]
        it = astream(10)
        part = [await it.__anext__(), await it.__anext__()]
        await it.aclose()
        return full, part

    full, part = asyncio.run(f())
    assert [x["i"] for x in full] == [0, 1, 2] and [x["i"] for x in part] == [0, 1]
    assert sorted(states(ledger)) == [("astream", 10, "done", 1), ("astream", 15, "done", 1)]
    assert ledger.lane("free").leased == 0 and ledger.audit() == []


# -- 4. run names: Prefect's, and name= / with_options(name=) ---------------------------
def test_task_run_names_are_prefects_and_follow_name_and_with_options(ledger):
    from prefect.client.orchestration import get_client

    @lane_task(stage="named", estimate=10)
    def body():
        return TaskRunContext.get().task_run.name

    assert body.task_run_name is None
    custom = f"custom-{uuid.uuid4().hex[:8]}"
    renamed = body.with_options(name=custom)
    outside = body()  # outside a flow Prefect names the run after the task
    inside = in_flow(lambda: (body(), renamed()))
    assert outside == "body" and inside[0].startswith("body-") and inside[1].startswith(f"{custom}-")
    with get_client(sync_client=True) as client:
        runs = client.read_task_runs()
    assert any(r.name == inside[1] for r in runs)
    assert lane_task(stage="s", estimate=1, name="by-name")(lambda: 1).name == "by-name"


# -- 5. retry_condition_fn: Prefect's check, and the refusal guard on every copy ----------
def test_non_callable_retry_condition_is_refused_like_prefect():
    with pytest.raises(TypeError, match="Expected `retry_condition_fn` to be callable, got str instead"):
        lane_task(stage="s", estimate=1, retry_condition_fn="not a callable")(lambda: 1)
    ok = lane_task(stage="s", estimate=1)(lambda: 1)
    with pytest.raises(TypeError, match="Expected `retry_condition_fn` to be callable, got int instead"):
        ok.with_options(retry_condition_fn=3)


def test_with_options_retry_condition_keeps_ledger_refusals_unretried(ledger):
    asked = []

    @lane_task(stage="strict", estimate=222, missing_usage="fail", retries=3, retry_delay_seconds=0)
    def strict():
        return "no usage here"

    always = strict.with_options(retry_condition_fn=lambda t, r, s: asked.append(1) or True)

    @flow
    def f():
        return always(return_state=True)

    with pytest.raises(UsageMissing):
        f().result()
    assert [j["attempt"] for j in job_rows(ledger)] == [1] and asked == []  # refused, never retried

    flaky = {"n": 0}

    @lane_task(stage="flaky", estimate=10, retries=2, retry_delay_seconds=0)
    def transient():
        flaky["n"] += 1
        if flaky["n"] < 2:
            raise RuntimeError("503")
        return 1

    async def async_yes(t, r, s):  # an async user condition still decides ordinary failures
        asked.append("async")
        return True

    assert in_flow(lambda: transient.with_options(retry_condition_fn=async_yes)()) == 1
    assert asked == ["async"] and flaky["n"] == 2


# -- 6. .fn is the user's function -----------------------------------------------------------
def test_fn_is_the_users_function_and_calling_it_touches_no_ledger(tmp_path, monkeypatch):
    where = tmp_path / "never" / "lane.db"
    monkeypatch.setenv("LANE_DATABASE_URL", f"sqlite:///{where}")

    def draft(doc: str):
        return {"usage": {"total_tokens": len(doc)}}

    gated = lane_task(stage="draft", estimate=100)(draft)
    assert gated.fn is draft and gated.with_options(retries=2).fn is draft
    assert gated.fn("abc") == {"usage": {"total_tokens": 3}}
    assert not where.parent.exists()  # no ledger was opened, let alone billed


def test_fn_called_inside_its_own_run_opens_no_second_gate(ledger):
    @lane_task(stage="self", estimate=100)
    def outer(depth: int):
        report_usage(3)
        return outer.fn(depth - 1) if depth else 0

    assert in_flow(lambda: outer(2)) == 0
    assert states(ledger) == [("self", 3 * 3, "done", 1)]


# -- 7. task keys and cache keys follow the user's code ----------------------------------------
def _versions():
    def summarize(doc):
        return "v1"

    first = summarize

    def summarize(doc):  # noqa: F811 - the same name, an edited body
        return "v2"

    return first, summarize


def test_task_and_cache_keys_change_when_the_body_changes(ledger):
    v1, v2 = _versions()
    t1 = lane_task(stage="sum", estimate=10, cache_key_fn=task_input_hash, persist_result=True)(v1)
    t2 = lane_task(stage="sum", estimate=10, cache_key_fn=task_input_hash, persist_result=True)(v2)
    assert t1.task_key == task(v1).task_key != t2.task_key == task(v2).task_key
    doc = uuid.uuid4().hex  # results persist across sessions: a fresh input

    @flow
    def f():
        return t1(doc), t2(doc)

    assert f() == ("v1", "v2")  # the edited body is not served the old body's cached result


# -- 8. lane_tags=False -------------------------------------------------------------------------
def test_lane_tags_false_runs_with_only_the_tasks_own_tags(ledger):
    from prefect.client.orchestration import get_client

    bare = lane_task(stage="bare", estimate=10, lane_tags=False)(lambda: 1)
    own = lane_task(stage="own", estimate=10, lane_tags=False, tags=["team:a"])(lambda: 1)
    assert bare.tags == set() and own.tags == {"team:a"}
    assert own.with_options(tags=[]).tags == set() and own.with_options(tags=["x"]).tags == {"x"}
    tagged = lane_task(stage="own", estimate=10)(lambda: 1)
    assert tagged.with_options(tags=[]).tags == {"lane:free", "stage:own"}  # on by default, and kept

    state = in_flow(lambda: bare(return_state=True))
    with get_client(sync_client=True) as client:
        assert client.read_task_run(state.state_details.task_run_id).tags == []
    assert states(ledger) == [("bare", 1, "done", 1)]  # still gated
    with pytest.raises(InvalidInput, match="lane_tags"):
        lane_task(stage="s", estimate=1, lane_tags="no")


# -- 9. missing usage: said once per task; NO_USAGE declares a task with no tokens --------
def test_missing_usage_is_said_once_per_task(ledger, caplog):
    caplog.set_level(logging.DEBUG, logger="prefect.task_runs")

    @lane_task(stage="quiet", estimate=321)
    def quiet():
        return "no usage here"

    @lane_task(stage="other", estimate=5)
    def other():
        return "nor here"

    in_flow(lambda: [quiet(), quiet(), quiet.with_options(name="copy")(), other()])
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and "found no token" in r.message]
    assert len(warned) == 2 and "quiet" in warned[0] and "other" in warned[1]
    assert "usage=NO_USAGE" in warned[0]
    assert [j["actual"] for j in job_rows(ledger)] == [321, 321, 321, 5]  # still billed every time


def test_no_usage_settles_zero_silently_but_counts_reported_tokens(ledger, caplog):
    caplog.set_level(logging.WARNING, logger="prefect.task_runs")

    @lane_task(stage="index", estimate=50, usage=NO_USAGE)
    def index(doc: str):
        return {"usage": {"total_tokens": 999}}  # not read: the task declared it has no usage

    @lane_task(stage="mixed", estimate=50, usage=NO_USAGE)
    def mixed():
        report_usage(12)  # an explicit report still counts
        return 1

    in_flow(lambda: (index("a"), mixed()))
    assert states(ledger) == [("index", 0, "done", 1), ("mixed", 12, "done", 1)]
    assert "found no token" not in caplog.text
    with pytest.raises(InvalidInput, match="missing_usage"):
        lane_task(stage="s", estimate=1, usage=NO_USAGE, missing_usage="fail")
    with pytest.raises(InvalidInput, match="usage"):
        lane_task(stage="s", estimate=1, usage="none")


def test_lane_task_returns_a_real_task_subclass_that_pickles():
    import cloudpickle

    t = lane_task(stage="s", estimate=1, retries=2)(score)
    assert isinstance(t, Task) and t.retries == 2
    back = cloudpickle.loads(cloudpickle.dumps(t))
    assert type(back) is type(t) and back.fn("ab", 2) == 4 and back.lane_spec.stage == "s"


def test_installed_prefect_is_inside_the_declared_and_tested_range():
    """pyproject.toml allows exactly the Prefect releases .ci/run tests: its floor (in a second
    venv) up to what the main venv resolves (the newest)."""
    import re
    from importlib.metadata import version
    from pathlib import Path

    from packaging.specifiers import SpecifierSet

    root = Path(__file__).resolve().parents[2]
    declared = re.search(r'"prefect([<>=!~][^"]*)"', (root / "pyproject.toml").read_text()).group(1)
    assert version("prefect") in SpecifierSet(declared), (version("prefect"), declared)
    assert re.search(r">=\s*3\.9\.0\b", declared), declared  # 3.9.0: the hook cache keys need
    from prefect.tasks import _get_task_source  # noqa: F401  (that hook)

    ci = (root / ".ci" / "run").read_text()
    assert '"prefect==$oldest"' in ci
    floor_leg = ci[ci.index(".venv-prefect-oldest/bin/python -m pytest") :]
    assert "tests/gating/test_dropin.py" in floor_leg.split("\n\n")[0], ci  # this file runs on the floor too
