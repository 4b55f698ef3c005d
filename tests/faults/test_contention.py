"""Items 3 and 4: many processes race for one lane; exactly the ceiling is admitted, every time."""

from __future__ import annotations

import pytest

from lane_plugin import Ledger

from .conftest import assert_audit_clean, figure, make_lane, read_json_lines, reps, spawn, wait_all
from .monitor import Monitor


def _race(url: str, tmp_path, *, procs: int, per_proc: int, ceiling: int, run: int) -> tuple[int, Monitor]:
    led = Ledger(url)
    make_lane(led, "free", ceiling=ceiling)
    go = tmp_path / f"go-{run}"
    outs = [tmp_path / f"out-{run}-{i}.jsonl" for i in range(procs)]
    workers = [spawn("contention", url, "free", per_proc, out, go) for out in outs]
    import time

    end = time.monotonic() + 300
    while not all((out.parent / (out.name + ".ready")).exists() for out in outs):
        assert time.monotonic() < end, "workers never became ready"
        assert all(w.poll() is None for w in workers), "a worker died before the start"
        time.sleep(0.02)
    mon = Monitor(url, "free", every=0.02)
    mon.start()
    go.touch()
    codes = wait_all(workers)
    mon.stop()
    assert codes == [0] * procs, f"worker exit codes {codes}"
    results = [r for out in outs for r in read_json_lines(out)]
    assert len(results) == procs
    errors = [e for r in results for e in r["errors"]]
    assert errors == [], "errors reached a caller:\n" + "\n".join(errors)
    assert mon.violations == [], mon.violations[:10]
    assert mon.errors == [], mon.errors[:5]
    admitted = sum(r["admitted"] for r in results)
    row = led.lane("free")
    assert row.spent == ceiling and row.reserved == 0 and row.overage == 0
    done = led.rows("select count(*) from job where state = 'done'")[1][0][0]
    # the ceiling is spent and the lane has no period: what is left can never fit and is parked, saying so
    left = led.rows("select state, reason from job where state not in ('done')")[1]
    assert done == admitted and len(left) == procs * per_proc - admitted
    assert all(state in ("new", "parked") and (state == "new" or "ceiling" in reason) for state, reason in left)
    assert_audit_clean(led)
    led.close()
    return admitted, mon


def _contention(url_factory, tmp_path, *, name, procs, per_proc, ceiling, runs):
    exact = 0
    max_committed = samples = audits = 0
    for run in range(runs):
        url = url_factory(run)
        admitted, mon = _race(url, tmp_path, procs=procs, per_proc=per_proc, ceiling=ceiling, run=run)
        assert admitted == ceiling, f"run {run}: admitted {admitted}, ceiling {ceiling}"
        exact += 1
        max_committed = max(max_committed, mon.max_committed)
        samples += mon.samples
        audits += mon.audits
    figure(
        f"contention {name}: {exact}/{runs} runs of {procs} processes x {per_proc} unit jobs admitted exactly "
        f"{ceiling}; max sampled committed {max_committed} <= ceiling {ceiling} over {samples} samples "
        f"and {audits} live audits; 0 errors reached a caller"
    )


@pytest.mark.pg_processes  # 8 ledger processes on PostgreSQL: one such test at a time
@pytest.mark.postgres
@pytest.mark.slow
def test_contention_postgres(pg_url, tmp_path):
    import uuid

    from .conftest import pg_admin

    admin = pg_admin()
    schemas = []

    def fresh(run):  # a fresh schema per repetition: every run starts from an empty ledger
        if run == 0:
            return pg_url
        schema = "f_" + uuid.uuid4().hex
        admin.execute(f"create schema {schema}")
        schemas.append(schema)
        return pg_url.rsplit("%3D", 1)[0] + "%3D" + schema

    try:
        _contention(fresh, tmp_path, name="pg", procs=8, per_proc=500, ceiling=1000, runs=reps(3, 20))
    finally:
        for s in schemas:
            admin.execute(f"drop schema if exists {s} cascade")
        admin.close()


@pytest.mark.slow
def test_contention_sqlite(tmp_path):
    def fresh(run):
        return f"sqlite:///{tmp_path / f'ledger-{run}.db'}"

    _contention(fresh, tmp_path, name="sqlite", procs=4, per_proc=250, ceiling=500, runs=reps(3, 20))
