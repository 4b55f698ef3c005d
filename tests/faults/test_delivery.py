"""Item 5: duplicate delivery. One settlement sent 100 times from 8 processes bills once;
one key submitted twice is one job; the same key with another estimate is a clear error."""

from __future__ import annotations

import threading
import time

import pytest

from lane_plugin import ConflictingReplay, Ledger

from .conftest import assert_audit_clean, counts, figure, make_lane, read_json_lines, reps, spawn, wait_all


@pytest.fixture(params=["sqlite", pytest.param("pg", marks=pytest.mark.postgres)])
def url(request, tmp_path):
    return request.getfixturevalue("pg_url" if request.param == "pg" else "sqlite_url")


def _dup_settle_round(led, url, tmp_path, rnd: int) -> tuple[int, int]:
    job = led.submit("dup", 10, "free")
    [lease] = led.tick("free")
    assert lease.job_id == job
    go = tmp_path / f"go-{rnd}"
    outs = [tmp_path / f"dup-{rnd}-{i}.jsonl" for i in range(8)]
    calls = [13] * 4 + [12] * 4  # 100 in all
    procs = [spawn("settle_dup", url, job, lease.attempt, 12, n, out, go) for n, out in zip(calls, outs)]
    end = time.monotonic() + 120
    while not all((o.parent / (o.name + ".ready")).exists() for o in outs):
        assert time.monotonic() < end and all(p.poll() is None for p in procs), "a worker died before the start"
        time.sleep(0.01)
    go.touch()
    assert wait_all(procs) == [0] * 8
    results = [r for o in outs for r in read_json_lines(o)]
    assert len(results) == 100
    assert [r for r in results if "error" in r] == []
    billed = [r for r in results if not r["replay"]]
    assert len(billed) == 1, f"{len(billed)} of 100 deliveries billed"
    assert all(r["actual"] == 12 for r in results)  # every replay returns the first result
    n = led.rows("select count(*) from settlement where job_id = :j", {"j": job})[1][0][0]
    assert n == 1
    return len(billed), n


@pytest.mark.pg_processes  # 8 ledger processes on PostgreSQL: one such test at a time
def test_duplicate_settlement_bills_once(url, tmp_path):
    led = Ledger(url)
    make_lane(led, ceiling=100_000)
    rounds = reps(2, 10)
    for rnd in range(rounds):
        _dup_settle_round(led, url, tmp_path, rnd)
    row = led.lane("free")
    assert row.spent == 12 * rounds and row.reserved == 0
    assert_audit_clean(led)
    figure(
        f"duplicate settle {led.db.dialect}: {rounds}/{rounds} rounds of 100 concurrent deliveries from 8 "
        f"processes billed exactly once; spent {row.spent} = {rounds} x 12"
    )


def test_duplicate_submit_is_one_job(url):
    led = Ledger(url)
    make_lane(led)
    a = led.submit("s", 5, "free", key="k-1")
    b = led.submit("s", 5, "free", key="k-1")
    assert a == b
    assert led.rows("select count(*) from job where key = 'k-1'")[1][0][0] == 1
    before = counts(led)
    with pytest.raises(ConflictingReplay, match="k-1.*estimate 5.*estimate 6"):
        led.submit("s", 6, "free", key="k-1")
    assert counts(led) == before
    assert_audit_clean(led)


@pytest.mark.postgres
def test_concurrent_duplicate_submit_is_one_job(pg_url):
    """The same key from 16 threads at once: one job, no database error (PostgreSQL, no global lock)."""
    led = Ledger(pg_url)
    make_lane(led)
    rounds = reps(5, 50)
    for rnd in range(rounds):
        ids, errors = [], []
        barrier = threading.Barrier(16)

        def one(barrier=barrier, ids=ids, errors=errors, rnd=rnd):
            try:
                own = Ledger(pg_url)
                own.lane("free")
                barrier.wait()
                ids.append(own.submit("s", 5, "free", key=f"race-{rnd}"))
                own.close()
            except Exception as exc:
                errors.append(f"{type(exc).__name__}: {exc}")

        threads = [threading.Thread(target=one) for _ in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == [], errors[:3]
        assert len(set(ids)) == 1
        assert led.rows("select count(*) from job where key = :k", {"k": f"race-{rnd}"})[1][0][0] == 1
    assert_audit_clean(led)
    figure(f"duplicate submit pg: {rounds}/{rounds} rounds of 16 concurrent submits with one key made one job")
