"""Tick latency and memory as the queue grows: 1k, 100k and 1M waiting (plus as many parked).

    python benchmarks/bench_tick.py                   # SQLite, and PostgreSQL if reachable
    python benchmarks/bench_tick.py --sizes 1000,100000 --no-pg

Admission reads only the head of the (lane, state, finishing, prio) index (two ranges: jobs of
runs under way, the rest), so its latency and the memory Python allocates during a tick must not
grow with the queue: the growth from 1k to 1M waiting stays within 2x on p50 latency. Each tick
admits up to 25 jobs (prunes the sliding rate window, lapses quiet runs' reserves), which are
then settled outside the timed section. The plan of the head query is printed for each database.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from lane_plugin import Ledger  # noqa: E402
from lane_plugin.ledger.admission import HEAD_SQL  # noqa: E402


def fill(led: Ledger, waiting: int) -> None:
    """Insert ``waiting`` new jobs and as many parked ones, set-based on the server."""
    now = time.time()
    if led.url.dialect == "postgresql":
        sql = (
            "insert into job (id, lane, stage, est, actual, state, attempt, lease_attempt, lease_until, "
            "created_at, wait_since, prio) select md5(random()::text || g::text || :st), 'scan', 'bench', "
            "1 + (g::bigint * 7919) % 9000, 0, :st, 1, 0, 0, :now, :now - g % 300, "
            ":now - g % 300 + (1 + (g::bigint * 7919) % 9000) * :f from generate_series(1, :n) g"
        )
    else:
        sql = (
            "with recursive g(i) as (select 1 union all select i + 1 from g where i < :n) "
            "insert into job (id, lane, stage, est, actual, state, attempt, lease_attempt, lease_until, "
            "created_at, wait_since, prio) select lower(hex(randomblob(16))), 'scan', 'bench', "
            "1 + (i * 7919) % 9000, 0, :st, 1, 0, 0, :now, :now - i % 300, "
            ":now - i % 300 + (1 + (i * 7919) % 9000) * :f from g"
        )
    f = led.lane("scan").policy.age_factor  # each job's place in the order, as intake writes it
    for state in ("new", "parked"):
        led.db.transaction(lambda cur, s=state: cur.execute(sql, {"n": waiting, "st": s, "now": now, "f": f}))
    led.db.transaction(
        lambda cur: cur.execute(  # every parked job has its tail entry (I6)
            "insert into tail (job_id, lane, stage, est, reason, parked_at, deadline) "
            "select id, lane, stage, est, 'bench', :now, :now + 86400 from job where state = 'parked'",
            {"now": now},
        )
    )
    if led.url.dialect == "postgresql":
        led.db.transaction(lambda cur: cur.execute("analyze job"))


def measure(url: str, waiting: int, ticks: int) -> dict:
    led = Ledger(url)
    led.set_lane("scan", allowance=10**12, ceiling=10**12, start_fraction=1.0, burst_tokens=10**9, max_leased=25)
    t = time.perf_counter()
    fill(led, waiting)
    filled = time.perf_counter() - t
    times = []
    tracemalloc.start()
    peak = 0
    for _ in range(min(ticks, waiting // 50)):  # every timed tick admits a full 25: the queue never runs dry
        tracemalloc.reset_peak()
        t = time.perf_counter()
        leases = led.tick("scan")
        times.append(time.perf_counter() - t)
        peak = max(peak, tracemalloc.get_traced_memory()[1])
        for lease in leases:
            led.settle(lease, lease.est)
    tracemalloc.stop()
    assert led.audit() == [], led.audit()
    params = {"l": "scan", "k": 41, "f": False, "t": True}  # the tick's own head query
    _, plan = led.rows(("explain query plan " if led.url.dialect == "sqlite" else "explain ") + HEAD_SQL, params)
    times.sort()
    led.close()
    return {
        "p50": statistics.median(times),
        "p99": times[max(0, int(len(times) * 0.99) - 1)],
        "peak": peak,
        "fill": filled,
        "plan": " / ".join(str(r[-1]).strip() for r in plan),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="1000,100000,1000000")
    ap.add_argument("--ticks", type=int, default=200)
    ap.add_argument(
        "--pg", default=os.environ.get("LANE_TEST_POSTGRES_URL", "postgresql+psycopg://root@127.0.0.1:5432/test")
    )
    ap.add_argument("--no-pg", action="store_true")
    ap.add_argument("--out", default=str(ROOT / "docs" / "performance_tick.md"))
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    lines = [
        f"Machine: {platform.node()}: {os.cpu_count()} cores, Python {platform.python_version()}",
        "",
        "| database | waiting (+ as many parked) | tick p50 | tick p99 | peak Python memory in a tick |",
        "|---|---|---|---|---|",
    ]
    backends = ["sqlite"] + ([] if args.no_pg else ["postgresql"])
    for backend in backends:
        p50s = {}
        for n in sizes:
            if backend == "sqlite":
                d = tempfile.mkdtemp(prefix="lane-tick-")
                url, cleanup = f"sqlite:///{d}/tick.db", (lambda d=d: shutil.rmtree(d, ignore_errors=True))
            else:
                try:
                    sys.path.insert(0, str(ROOT / "tests"))
                    from conftest import PgSchema

                    schema = PgSchema(args.pg, prefix="tick")
                except Exception as exc:  # noqa: BLE001
                    print(f"PostgreSQL skipped: {exc}")
                    break
                url, cleanup = schema.url, schema.drop
            try:
                r = measure(url, n, args.ticks)
            finally:
                cleanup()
            p50s[n] = r["p50"]
            line = (
                f"| {backend} | {n:,} | {r['p50'] * 1e3:.2f} ms | {r['p99'] * 1e3:.2f} ms | "
                f"{r['peak'] / 1024:.0f} KiB |"
            )
            print(line + f"  (filled in {r['fill']:.1f} s)", flush=True)
            print(f"    plan of the head query: {r['plan']}", flush=True)
            lines.append(line)
        if len(p50s) > 1:
            lo, hi = min(p50s), max(p50s)
            line = f"| {backend} | growth {lo:,} → {hi:,} | {p50s[hi] / p50s[lo]:.2f}× p50 | | |"
            print(line, flush=True)
            lines.append(line)
    cmd = "python benchmarks/bench_tick.py " + " ".join(sys.argv[1:])
    Path(args.out).write_text(
        "## Tick latency as the queue grows\n\nCommand: `" + cmd.strip() + "`\n\n" + "\n".join(lines) + "\n"
    )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
