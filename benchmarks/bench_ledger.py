"""Ledger throughput and scan cost, printed as figures (not a timed test).

    python benchmarks/bench_ledger.py                 # SQLite, and PostgreSQL if reachable
    python benchmarks/bench_ledger.py --seconds 5 --pg postgresql+psycopg://root@127.0.0.1:5432/test

1. admit+settle cycles/s with 1, 4 and 8 processes, through the Ledger and
   through the same two transactions as plain DB-API SQL with no policy, no
   validation and no retry (the practical limit on this machine); ratio ledger/plain.
2. tick latency with 1k and 100k jobs waiting (and 100k parked), plus the
   query plan of the admission scan: it reads the head of an index.
3. `lane submit` / `tick` / `settle` wall time per call (the article's shell loop).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from lane_plugin import Ledger  # noqa: E402
from lane_plugin.ledger.db import Database  # noqa: E402

JOBS_PER_PROC = 400_000  # more than any run can consume


def machine() -> str:
    return f"{platform.node()}: {os.cpu_count()} cores, Python {platform.python_version()}, {platform.platform()}"


# -- workers --------------------------------------------------------------------
def _seed(url: str, procs: int) -> None:
    led = Ledger(url)
    for i in range(procs):
        led.set_lane(
            f"b{i}",
            allowance=10**12,
            ceiling=10**12,
            start_fraction=1.0,
            burst_tokens=10**9,
            max_leased=1,
            window_seconds=1.0,
        )
    now = time.time()

    def fill(cur):
        rows = [
            dict(id=uuid.uuid4().hex, lane=f"b{i}", est=1 + (k % 50), now=now, prio=now + (1 + k % 50) * 600 / 10**9)
            for i in range(procs)
            for k in range(20_000)
        ]
        cur.executemany(
            "insert into job (id, lane, stage, est, actual, state, attempt, lease_attempt, lease_until, "
            "created_at, wait_since, prio) values (:id, :lane, 'bench', :est, 0, 'new', 1, 0, 0, :now, :now, :prio)",
            rows,
        )

    led.db.transaction(fill)
    led.close()


def _ledger_worker(url: str, lane: str, seconds: float, out) -> None:
    led = Ledger(url)
    n = 0
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        for lease in led.tick(lane):
            led.settle(lease, lease.est)
            n += 1
    out.put(n)


def _plain_worker(url: str, lane: str, seconds: float, out) -> None:
    """The same two transactions with nothing but SQL: the practical limit."""
    from lane_plugin.ledger.url import parse_url

    db = Database(parse_url(url))
    n = 0
    end = time.perf_counter() + seconds

    def admit(cur):
        lock = " for update" if cur.dialect == "postgresql" else ""
        spent, reserved, ceiling = cur.one(
            f"select spent, reserved, ceiling from lane where name = :l{lock}", {"l": lane}
        )
        row = cur.one(
            "select id, est from job where lane = :l and state = 'new' and finishing = :f order by prio limit 1",
            {"l": lane, "f": False},
        )
        if row is None or spent + reserved + row[1] > ceiling:
            return None
        cur.execute(
            "update lane set reserved = reserved + :e, leased = leased + 1 where name = :l", {"e": row[1], "l": lane}
        )
        cur.execute(
            "update job set state = 'leased', lease_attempt = attempt, lease_until = :u where id = :id",
            {"u": time.time() + 90, "id": row[0]},
        )
        return row

    def settle(cur, job_id, est):
        cur.execute(
            "insert into settlement (job_id, attempt, lane, est, actual, overage, late, outcome, settled_at) "
            "values (:j, 1, :l, :e, :e, 0, false, 'done', :now)",
            {"j": job_id, "l": lane, "e": est, "now": time.time()},
        )
        cur.execute("update job set state = 'done', actual = :e where id = :j", {"e": est, "j": job_id})
        cur.execute(
            "update lane set spent = spent + :e, reserved = reserved - :e, leased = leased - 1 where name = :l",
            {"e": est, "l": lane},
        )

    while time.perf_counter() < end:
        row = db.transaction(admit)
        if row:
            db.transaction(lambda cur, r=row: settle(cur, r[0], r[1]))
            n += 1
    out.put(n)


def throughput(url_factory, procs: int, seconds: float, kind: str) -> float:
    url, cleanup = url_factory()
    try:
        _seed(url, procs)
        ctx = mp.get_context("spawn")
        out = ctx.Queue()
        target = _ledger_worker if kind == "ledger" else _plain_worker
        ps = [ctx.Process(target=target, args=(url, f"b{i}", seconds, out)) for i in range(procs)]
        t0 = time.perf_counter()
        for p in ps:
            p.start()
        total = sum(out.get(timeout=seconds + 120) for _ in ps)
        for p in ps:
            p.join()
        wall = time.perf_counter() - t0
        audit = Ledger(url).audit()
        assert kind == "plain" or audit == [], audit
        return total / max(seconds, wall - 1.0 if wall > seconds + 1.0 else seconds)
    finally:
        cleanup()


# -- databases -------------------------------------------------------------------
def sqlite_factory():
    d = tempfile.mkdtemp(prefix="lane-bench-")
    return f"sqlite:///{d}/bench.db", lambda: shutil.rmtree(d, ignore_errors=True)


def pg_factory(base: str):
    import psycopg

    from lane_plugin.ledger.url import parse_url

    def make():
        name = f"bench_{uuid.uuid4().hex[:10]}"
        kw = parse_url(base).conninfo
        with psycopg.connect(**kw, autocommit=True) as c:
            c.execute(f'create schema "{name}"')

        def drop():
            with psycopg.connect(**kw, autocommit=True) as c:
                c.execute(f'drop schema "{name}" cascade')

        sep = "&" if "?" in base else "?"
        return f"{base}{sep}options=-csearch_path%3D{name}", drop

    return make


# -- scan cost -------------------------------------------------------------------
def scan_cost(url_factory, label: str) -> list[str]:
    """Tick latency at 1k and 100k waiting (each with 100k parked), and the admission scan's plan."""
    from bench_tick import measure

    lines = []
    for waiting in (1_000, 100_000):
        url, cleanup = url_factory()
        try:
            r = measure(url, waiting, 100)
        finally:
            cleanup()
        lines.append(
            f"| {label} | {waiting:,} waiting + {waiting:,} parked | {r['p50'] * 1e3:.2f} ms "
            f"| {r['p99'] * 1e3:.2f} ms |"
        )
    lines.append(f"|  | plan at 100k: {r['plan'][:160]} | | |")
    return lines


def cli_loop(n: int = 40) -> list[str]:
    lane = str(Path(sys.executable).with_name("lane"))
    d = tempfile.mkdtemp(prefix="lane-cli-")
    env = {**os.environ, "LANE_DATABASE_URL": f"sqlite:///{d}/cli.db"}
    try:
        subprocess.run([lane, "db", "upgrade"], env=env, check=True, capture_output=True)
        out = []
        ids = []
        t = time.perf_counter()
        for i in range(n):
            ids.append(
                subprocess.run(
                    [lane, "submit", "--stage", "draft", "--est", str(500 + i * 37)],
                    env=env,
                    check=True,
                    capture_output=True,
                    text=True,
                ).stdout.strip()
            )
        out.append(("submit", (time.perf_counter() - t) / n))
        t = time.perf_counter()
        subprocess.run([lane, "tick"], env=env, check=True, capture_output=True)
        out.append(("tick", time.perf_counter() - t))
        t = time.perf_counter()
        for jid in ids[:10]:
            subprocess.run([lane, "settle", jid, "--actual", "600"], env=env, check=True, capture_output=True)
        out.append(("settle", (time.perf_counter() - t) / 10))
        return [f"| `lane {cmd}` | {sec:.3f} s |" for cmd, sec in out] + [
            f"| 200-call loop of `lane submit` (projected) | {out[0][1] * 200:.1f} s |"
        ]
    finally:
        shutil.rmtree(d, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=4.0, help="run time of each throughput cell")
    ap.add_argument(
        "--pg", default=os.environ.get("LANE_TEST_POSTGRES_URL", "postgresql+psycopg://root@127.0.0.1:5432/test")
    )
    ap.add_argument("--procs", default="1,4,8")
    ap.add_argument("--out", default=str(ROOT / "docs" / "performance_ledger.md"))
    args = ap.parse_args()
    dbs = [("SQLite", sqlite_factory)]
    try:
        import psycopg

        from lane_plugin.ledger.url import parse_url

        psycopg.connect(**parse_url(args.pg).conninfo, connect_timeout=3).close()
        dbs.append(("PostgreSQL", pg_factory(args.pg)))
    except Exception as exc:  # noqa: BLE001
        print(f"PostgreSQL skipped: {exc}")
    lines = [
        f"Machine: {machine()}",
        "",
        "### admit+settle cycles per second",
        "",
        "| database | processes | ledger | plain SQL | ledger / plain |",
        "|---|---|---|---|---|",
    ]
    for label, factory in dbs:
        for procs in [int(p) for p in args.procs.split(",")]:
            ledger = throughput(factory, procs, args.seconds, "ledger")
            plain = throughput(factory, procs, args.seconds, "plain")
            line = f"| {label} | {procs} | {ledger:,.0f}/s | {plain:,.0f}/s | {ledger / plain:.0%} |"
            print(line, flush=True)
            lines.append(line)
    lines += [
        "",
        "### tick latency and the admission scan",
        "",
        "| database | queue | p50 | p99 |",
        "|---|---|---|---|",
    ]
    for label, factory in dbs:
        for line in scan_cost(factory, label):
            print(line, flush=True)
            lines.append(line)
    lines += ["", "### CLI wall time per call (SQLite)", "", "| call | time |", "|---|---|"]
    for line in cli_loop():
        print(line, flush=True)
        lines.append(line)
    cmd = "python benchmarks/bench_ledger.py " + " ".join(sys.argv[1:])
    Path(args.out).write_text("## Ledger\n\nCommand: `" + cmd.strip() + "`\n\n" + "\n".join(lines) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
