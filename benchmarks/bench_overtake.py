"""What rule 12 costs the ledger (lane setting ``overtake_slack``): intake and tick latency, on and off.

    python benchmarks/bench_overtake.py                      # SQLite, and PostgreSQL if reachable
    python benchmarks/bench_overtake.py --sizes 1000,5000 --no-pg

Per database and queue size, a fresh lane is filled through ``Ledger.submit`` (random sizes, a heavy tail), so
every job is numbered as a user's would be, then ticked until it is drained to half, each tick admitting up to
25 jobs (settled outside the timed section). The same run with the rule off is the baseline, in the same
process, on the same traffic. Printed: the last 200 intakes' and the ticks' p50 / p99 and the ratio on / off,
the slowest of the first ticks (they number the fill, 512 a tick), and the epochs alive once a quarter is
drained. With the rule on, intake writes one more column; a tick numbers what entered since the last (summing
the rate tokens waiting once), reads one index head per epoch with a waiting job and at most a few epochs' rows,
and writes the older epochs' counters and at most 63 rows per admission.
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench_ledger import pg_factory  # noqa: E402

from lane_plugin import Ledger  # noqa: E402

TICK_ADMITS = 25


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def cell(url: str, waiting: int, slack: float | None, seed: int = 1) -> dict:
    gc.collect()  # the last cell's garbage, collected here: a full collection inside a timed tick cost it 60 ms
    led = Ledger(url)
    try:
        led.set_lane(
            "bench",
            allowance=10**12,
            ceiling=10**12,
            start_fraction=1.0,
            burst_tokens=10**10,
            max_leased=TICK_ADMITS,
            max_wait_seconds=600.0,
            overtake_slack=slack,
        )
        rng = random.Random(seed)
        intakes = []
        for _ in range(waiting):
            est = min(100_000, int(rng.lognormvariate(7.5, 1.2)) + 1)
            t = time.perf_counter()
            led.submit("bench", est, "bench")
            intakes.append(time.perf_counter() - t)
        ticks, epochs = [], 0
        while len(ticks) < waiting // (2 * TICK_ADMITS):
            t = time.perf_counter()
            leases = led.tick("bench")
            ticks.append(time.perf_counter() - t)
            for lease in leases:
                led.settle(lease, lease.est)
            if len(ticks) == waiting // TICK_ADMITS // 4:  # the fill numbered (512 a tick), a quarter drained
                epochs = led._run(
                    lambda cur, now: cur.scalar("select count(*) from lane_epoch where lane = 'bench'"), write=False
                )
        assert led.audit() == [], "the ledger must stay sound under the benchmark"
        last = intakes[-200:]
        return {
            "intake_p50": statistics.median(last),
            "intake_p99": _pct(last, 0.99),
            "tick_p50": statistics.median(ticks),
            "tick_p99": _pct(ticks, 0.99),
            "epochs": int(epochs),
            "first": max(ticks[: -(-waiting // 512)]),
        }
    finally:
        led.close()


def run(label: str, factory, sizes: list[int], slack: float) -> list[str]:
    rows = []
    for waiting in sizes:
        got = {}
        for name, value in (("off", None), ("on", slack)):
            url, cleanup = factory()
            try:
                got[name] = cell(url, waiting, value)
            finally:
                cleanup()
        on, off = got["on"], got["off"]
        rows.append(
            f"| {label} | {waiting:,} | {off['intake_p50'] * 1e3:.2f} / {off['intake_p99'] * 1e3:.2f} ms "
            f"| {on['intake_p50'] * 1e3:.2f} / {on['intake_p99'] * 1e3:.2f} ms "
            f"({on['intake_p50'] / off['intake_p50']:.1f}x) "
            f"| {off['tick_p50'] * 1e3:.2f} / {off['tick_p99'] * 1e3:.2f} ms "
            f"| {on['tick_p50'] * 1e3:.2f} / {on['tick_p99'] * 1e3:.2f} ms ({on['tick_p50'] / off['tick_p50']:.1f}x) "
            f"| {on['first'] * 1e3:.1f} ms | {on['epochs']} |"
        )
        print(rows[-1], flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="1000,5000", help="jobs filled per cell, comma-separated (default 1000,5000)")
    ap.add_argument("--slack", type=float, default=1.25, help="the rule's slack when on (default 1.25)")
    ap.add_argument("--no-pg", action="store_true", help="SQLite only")
    ap.add_argument(
        "--pg",
        default=os.environ.get("LANE_TEST_POSTGRES_URL", "postgresql+psycopg://root@127.0.0.1:5432/test"),
        help="a PostgreSQL URL (default LANE_TEST_POSTGRES_URL)",
    )
    a = ap.parse_args()
    try:
        sizes = [int(x) for x in a.sizes.split(",")]
    except ValueError:
        ap.error(f"--sizes must be whole numbers separated by commas, got {a.sizes!r}")
    if min(sizes) < 2 * TICK_ADMITS:
        ap.error(f"--sizes must each be at least {2 * TICK_ADMITS}, got {a.sizes!r}")
    print(
        "| database | jobs filled | intake p50 / p99, off | on | tick p50 / p99, off | on "
        "| on: slowest tick numbering the fill | epochs alive |\n"
        "|---|---|---|---|---|---|---|---|",
        flush=True,
    )
    tmp = Path(tempfile.mkdtemp(prefix="bench-overtake-"))
    n = [0]

    def sqlite():
        n[0] += 1
        path = tmp / f"l{n[0]}.db"
        return f"sqlite:///{path}", lambda: path.unlink(missing_ok=True)

    run("sqlite", sqlite, sizes, a.slack)
    if a.no_pg:
        return
    try:
        import psycopg

        from lane_plugin.ledger.url import parse_url

        psycopg.connect(**parse_url(a.pg).conninfo, connect_timeout=3).close()
    except Exception as exc:  # noqa: BLE001 - said, then skipped
        print(f"(PostgreSQL skipped: {exc})")
        return
    run("postgresql", pg_factory(a.pg), sizes, a.slack)


if __name__ == "__main__":
    main()
