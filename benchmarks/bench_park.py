"""Benchmark: park_overdue over 100,000 overdue jobs, on SQLite and PostgreSQL.

Target: one pass (reap + park + expire) under 10 s, every job parked exactly
once -- also when two processes run the pass at the same moment.

Usage::

    .venv/bin/python benchmarks/bench_park.py                      # SQLite only
    .venv/bin/python benchmarks/bench_park.py --jobs 100000 \\
        --postgres postgresql+psycopg://root@127.0.0.1:5432/test

PostgreSQL runs in a private schema (``bench_<hex>``, through the URL's
``options=-csearch_path``) that is dropped afterwards.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import sys
import tempfile
import time
import uuid
from urllib.parse import quote

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from lane_plugin import Ledger  # noqa: E402


def make_overdue(led: Ledger, n: int, *, lanes=("free", "paid"), chunk: int = 20_000) -> list[str]:
    """Insert ``n`` jobs waiting past their deadline (bulk SQL: setup is not what we measure)."""
    now = led.now()
    ids = [uuid.uuid4().hex for _ in range(n)]
    cols = (
        "id",
        "lane",
        "stage",
        "est",
        "actual",
        "state",
        "attempt",
        "lease_attempt",
        "lease_until",
        "deadline",
        "created_at",
        "wait_since",
    )
    sql = f"insert into job ({', '.join(cols)}) values ({', '.join(':' + c for c in cols)})"
    for start in range(0, n, chunk):
        rows = [
            dict(
                id=j,
                lane=lanes[i % len(lanes)],
                stage=("draft", "review", "summarize")[i % 3],
                est=100 + i % 900,
                actual=0,
                state="new",
                attempt=1,
                lease_attempt=0,
                lease_until=0.0,
                deadline=now - 60 - i % 600,
                created_at=now - 3600,
                wait_since=now - 3600,
            )
            for i, j in enumerate(ids[start : start + chunk], start)
        ]
        led.db.transaction(lambda cur, rows=rows: cur.executemany(sql, rows))
    return ids


def _pass(url: str, barrier, out) -> None:
    led = Ledger(url)
    led.now()  # connect and check the schema before the start line
    barrier.wait()
    t0 = time.perf_counter()
    moved = led.park_overdue()
    out.put((time.perf_counter() - t0, [j["job_id"] for j in moved.parked]))
    led.close()


def check(led: Ledger, ids: list[str], parked_lists: list[list[str]]) -> str:
    """Each job parked exactly once: in exactly one pass's result, once in the tail, state parked."""
    flat = [j for lst in parked_lists for j in lst]
    assert len(flat) == len(set(flat)) == len(ids), f"parked {len(flat)} ({len(set(flat))} distinct) of {len(ids)}"
    assert set(flat) == set(ids), "a parked job is not one of the overdue ones"
    ((tail, distinct),) = led.rows("select count(*), count(distinct job_id) from tail")[1]
    ((state,),) = led.rows("select count(*) from job where state = 'parked'")[1]
    assert tail == distinct == state == len(ids), f"tail {tail}, distinct {distinct}, parked state {state}"
    again = led.park_overdue()
    assert not again.parked, f"a second pass parked {len(again.parked)} more"
    return f"verified: {len(ids):,} parked exactly once (tail rows {tail:,}, distinct {distinct:,})"


def bench(url: str, n: int, label: str) -> list[str]:
    lines = []
    led = Ledger(url)
    led.upgrade()
    ids = make_overdue(led, n)
    t0 = time.perf_counter()
    moved = led.park_overdue()
    single = time.perf_counter() - t0
    lines.append(
        f"{label}: one pass parked {len(moved.parked):,} of {n:,} overdue jobs in {single:.2f} s "
        f"({'PASS' if single < 10 else 'FAIL'} < 10 s)"
    )
    lines.append(f"{label}: {check(led, ids, [[j['job_id'] for j in moved.parked]])}")
    # two copies at once, on fresh overdue jobs
    led.db.transaction(lambda cur: (cur.execute("delete from tail"), cur.execute("delete from job")))
    ids = make_overdue(led, n)
    ctx = mp.get_context("spawn")
    barrier, out = ctx.Barrier(2), ctx.Queue()
    procs = [ctx.Process(target=_pass, args=(url, barrier, out)) for _ in range(2)]
    for p in procs:
        p.start()
    results = [out.get(timeout=300) for _ in procs]
    for p in procs:
        p.join(60)
    times = sorted(t for t, _ in results)
    counts = [len(lst) for _, lst in results]
    lines.append(
        f"{label}: two concurrent passes took {times[0]:.2f} s and {times[1]:.2f} s, parked "
        f"{counts[0]:,} + {counts[1]:,}"
    )
    lines.append(f"{label}: {check(led, ids, [lst for _, lst in results])}")
    led.close()
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=100_000)
    ap.add_argument(
        "--postgres",
        default=os.environ.get("LANE_BENCH_POSTGRES_URL"),
        help="PostgreSQL base URL (a private schema is created and dropped)",
    )
    args = ap.parse_args()
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        out += bench(f"sqlite:///{tmp}/bench.db", args.jobs, "sqlite")
    if args.postgres:
        import psycopg

        from lane_plugin.ledger.url import parse_url

        schema = f"bench_{uuid.uuid4().hex[:10]}"
        kwargs = dict(parse_url(args.postgres).conninfo)
        with psycopg.connect(**kwargs, autocommit=True) as conn:
            conn.execute(f'create schema "{schema}"')
        try:
            sep = "&" if "?" in args.postgres else "?"
            out += bench(f"{args.postgres}{sep}options={quote('-csearch_path=' + schema)}", args.jobs, "postgresql")
        finally:
            with psycopg.connect(**kwargs, autocommit=True) as conn:
                conn.execute(f'drop schema if exists "{schema}" cascade')
    for line in out:
        print(line)


if __name__ == "__main__":
    main()
