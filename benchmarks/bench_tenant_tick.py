"""Tick latency of a lane shared by many tenants, with rule 12 off and binding, on SQLite and PostgreSQL.

    python benchmarks/bench_tenant_tick.py                       # 1, 10, 100 tenants; 4,000 waiting
    python benchmarks/bench_tenant_tick.py --tenants 1,500 --waiting 4000 --no-pg
    python benchmarks/bench_tenant_tick.py --analyze             # with the job table's statistics gathered first

Each cell submits ``--waiting`` jobs (sizes 100 to 20,000 tokens, the tenants interleaved) through the ledger's
API to a new lane of 25 lease slots, lets its ticks number them, then times ``--ticks`` ticks that each admit 25
(settled, and as many new jobs submitted, outside the timed section: the queue stays as deep). Rule 12 is off, or
on its second day (``overtake_q`` seeded 100,000: the rooms bind). The job table is never analysed unless
``--analyze`` says so: a new deployment's first minutes, where PostgreSQL plans without statistics. The baseline
in the same run is one tenant with rule 12 off; every row prints its ratio to it (each database's first row).
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from lane_plugin import Ledger  # noqa: E402

SIZES = (100, 300, 1_000, 5_000, 20_000)


def measure(url: str, tenants: int, waiting: int, ticks: int, rule: bool, analyze: bool) -> dict:
    led = Ledger(url)
    try:
        rule_12 = {"overtake_q": 100_000} if rule else {"overtake_slack": None}
        led.set_lane(
            "scan", allowance=10**12, ceiling=10**12, start_fraction=1.0, burst_tokens=10**9, max_leased=25, **rule_12
        )
        rnd = random.Random(1)
        for i in range(waiting):
            led.submit("s", rnd.choice(SIZES), lane="scan", tenant=f"t{i % tenants}")
        unnumbered = "select count(*) from job where state = 'new' and arrival_pos < 0"
        while True:  # numbered 512 a tick; what those ticks lease is settled (the timed ticks find it free)
            for lease in led.tick("scan"):
                led.settle(lease, lease.est)
            if led.rows(unnumbered)[1][0][0] == 0:
                break
        if analyze:
            led.db.transaction(lambda cur: cur.execute("analyze job" if led.url.dialect == "postgresql" else "analyze"))
        times, leased = [], 0
        for _ in range(ticks):
            t = time.perf_counter()
            leases = led.tick("scan")
            times.append(time.perf_counter() - t)
            leased += len(leases)
            for lease in leases:
                led.settle(lease, lease.est)
                led.submit("s", rnd.choice(SIZES), lane="scan", tenant=f"t{rnd.randrange(tenants)}")
        assert led.audit() == [], led.audit()
        epochs = led.rows("select count(*) from lane_epoch")[1][0][0]
    finally:
        led.close()
    times.sort()
    return {
        "p50": statistics.median(times),
        "p99": times[max(0, int(len(times) * 0.99) - 1)],
        "per_tick": leased / ticks,
        "epochs": epochs,
    }


def databases(args) -> list[tuple[str, object]]:
    out: list[tuple[str, object]] = [("sqlite", None)]
    if not args.no_pg:
        try:
            sys.path.insert(0, str(ROOT / "tests"))
            from conftest import PgSchema

            PgSchema(args.pg, prefix="tenanttick").drop()  # (reachable?)
            out.append(("postgresql", PgSchema))
        except Exception as exc:  # noqa: BLE001
            print(f"PostgreSQL skipped: {exc}")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tenants", default="1,10,100", help="tenant counts, one row each (default 1,10,100)")
    ap.add_argument("--waiting", type=int, default=4000, help="jobs waiting (default 4,000)")
    ap.add_argument("--ticks", type=int, default=40, help="timed ticks per row (default 40)")
    ap.add_argument("--analyze", action="store_true", help="gather the job table's statistics before timing")
    ap.add_argument(
        "--pg", default=os.environ.get("LANE_TEST_POSTGRES_URL", "postgresql+psycopg://root@127.0.0.1:5432/test")
    )
    ap.add_argument("--no-pg", action="store_true")
    args = ap.parse_args()
    counts = [int(t) for t in args.tenants.split(",")]
    print(
        f"{args.waiting:,} waiting, 25 admitted a tick, {args.ticks} ticks a row, job table "
        f"{'analysed' if args.analyze else 'never analysed'}; load average {os.getloadavg()[0]:.1f}",
        flush=True,
    )
    print("\n| database | tenants | rule 12 | tick p50 | tick p99 | x baseline (p50) | leased a tick | epoch rows |")
    print("|---|---|---|---|---|---|---|---|")
    for backend, pg in databases(args):
        base = None
        for rule in (False, True):
            for n in counts:
                if pg is None:
                    d = tempfile.mkdtemp(prefix="lane-tenant-tick-")
                    url, cleanup = f"sqlite:///{d}/tick.db", (lambda d=d: shutil.rmtree(d, ignore_errors=True))
                else:
                    schema = pg(args.pg, prefix="tenanttick")
                    url, cleanup = schema.url, schema.drop
                try:
                    r = measure(url, n, args.waiting, args.ticks, rule, args.analyze)
                finally:
                    cleanup()
                if base is None:
                    base = r["p50"]  # one tenant, rule off: the first row of each database
                print(
                    f"| {backend} | {n} | {'binding' if rule else 'off'} | {r['p50'] * 1e3:.1f} ms | "
                    f"{r['p99'] * 1e3:.1f} ms | {r['p50'] / base:.2f}x | {r['per_tick']:.0f} | {r['epochs']:,} |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
