"""Many waiters, few slots: how fast freed room reaches a waiter, and what waiting costs the database.

    python benchmarks/bench_waiters.py                 # every scenario; writes docs/performance_waiters.md
    python benchmarks/bench_waiters.py --quick         # smaller counts (the 1,000 waiters become 200)
    python benchmarks/bench_waiters.py --only target --db sqlite --no-prefect --no-write

N waiters in P processes (threads, ``with gate(stage="w", estimate=100, lane=...)``, outside a
Prefect run) hold their lease H seconds each, on a lane of S slots (``max_leased``), on a fresh
SQLite ledger and a fresh PostgreSQL schema. Beside them the same workload gated by Prefect's own
``concurrency(name, occupy=1)`` on a global concurrency limit of S on a real ``prefect server start``
(its own PREFECT_HOME, SQLite). The ledger's waiters send their events to that server too.

Figures: wall time against the ideal (each wave of S jobs takes H; random holds: total hold / S, at
least the longest hold), slot utilisation (total hold / (S x wall)), database transactions per job
(every commit of every process: intake, ticks, hand-offs, wake-up reads, heartbeats, settlements;
reads included), lane-lock wait p50/p99 (a writer waiting for ``BEGIN IMMEDIATE`` on SQLite, for the
lane row's ``FOR UPDATE`` on PostgreSQL: timed in the client around the statement, so its round trip
and the client's own scheduling are in it; one sample per transaction, its first lock), lane-lock
hold p50/p99 (from getting that lock to the end of the commit that releases it), and slot refill latency p99 (the k-th job picked up after
the first S against the k-th release: from a settlement's commit to the next waiter's body starting).

Targets (issue 14), printed met or missed: 80 jobs x 1 s on 10 slots from 2 processes within 9.2 s
and at most 10 transactions per job, on PostgreSQL and on SQLite; 1,000 waiters in 4 processes on
PostgreSQL: slot refill p99 < 50 ms and lane-lock wait p99 < 50 ms.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from pathlib import Path
from urllib.parse import quote

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
DOC = ROOT / "docs" / "performance_waiters.md"
LANE = "w"
NOTES = "<!-- notes: everything from this line on is kept when bench_waiters.py rewrites this page -->"
GCL = "bench-waiters"


# -- one worker process -------------------------------------------------------------------------
def worker(spec: dict) -> None:
    """Run this process's share of waiters; write their timings and the ledger's costs as JSON."""
    holds = spec["holds"]
    out: list[dict] = []
    lock = threading.Lock()
    if spec["kind"] == "ledger":
        from lane_plugin import gate
        from lane_plugin.gating.events import may_emit
        from lane_plugin.gating.ledgers import get_ledger, prefect_run

        led = get_ledger(spec["url"])
        led.lane(LANE)  # connect, check the schema and import Prefect before the start signal
        prefect_run(), may_emit()

        def one(hold: float) -> None:
            t0 = time.time()
            with gate(stage="w", estimate=100, lane=LANE, ledger=led) as g:
                t1 = time.time()
                time.sleep(hold)
                g.report(100)
            with lock:
                out.append({"submit": t0, "pick": t1, "release": time.time(), "hold": hold})
    else:
        from prefect.concurrency.sync import concurrency

        def one(hold: float) -> None:
            t0 = time.time()
            with concurrency(GCL, occupy=1):
                t1 = time.time()
                time.sleep(hold)
            with lock:
                out.append({"submit": t0, "pick": t1, "release": time.time(), "hold": hold})

    Path(spec["out"] + ".ready").touch()
    while not Path(spec["go"]).exists():
        time.sleep(0.002)
    threads = [threading.Thread(target=one, args=(h,)) for h in holds]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stats = led.db.stats.snapshot() if spec["kind"] == "ledger" else {}
    Path(spec["out"]).write_text(json.dumps({"jobs": out, "stats": stats}))


# -- the parent ------------------------------------------------------------------------------------
def pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, math.ceil(q * len(xs)) - 1))]


def holds_for(n: int, hold: str, seed: int) -> list[float]:
    if ":" in hold:
        lo, hi = map(float, hold.split(":"))
        rng = random.Random(seed)
        return [round(rng.uniform(lo, hi), 3) for _ in range(n)]
    return [float(hold)] * n


def ideal(holds: list[float], slots: int) -> float:
    if len(set(holds)) == 1:
        return math.ceil(len(holds) / slots) * holds[0]
    return max(sum(holds) / slots, max(holds))


def run_once(
    kind: str, url: str | None, n: int, procs: int, slots: int, hold: str, env: dict, tmp: Path, timeout: float
) -> dict:
    holds = holds_for(n, hold, seed=n * 7 + slots)
    if kind == "ledger":
        from lane_plugin import Ledger

        led = Ledger(url)
        led.set_lane(
            LANE,
            allowance=10**12,
            ceiling=10**12,
            start_fraction=1.0,
            burst_tokens=10**12,
            max_leased=slots,
            lease_seconds=60.0,
        )
        led.close()
    run = tmp / uuid.uuid4().hex[:8]
    run.mkdir()
    go = run / "go"
    children = []
    for p in range(procs):
        spec = {"kind": kind, "url": url, "holds": holds[p::procs], "out": str(run / f"w{p}.json"), "go": str(go)}
        children.append(subprocess.Popen([sys.executable, __file__, "--worker", json.dumps(spec)], env=env))
    end = time.monotonic() + 300
    while not all((run / f"w{p}.json.ready").exists() for p in range(procs)):
        if any(c.poll() not in (None, 0) for c in children) or time.monotonic() > end:
            for c in children:
                c.kill()
            raise SystemExit(f"a {kind} worker did not start")
        time.sleep(0.05)
    t_go = time.time()
    go.touch()
    for c in children:
        try:
            c.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            for k in children:
                k.kill()
            return {"kind": kind, "n": n, "procs": procs, "slots": slots, "hold": hold, "timeout": timeout}
    jobs, stats = [], []
    for p in range(procs):
        data = json.loads((run / f"w{p}.json").read_text())
        jobs += data["jobs"]
        stats.append(data["stats"])
    wall = max(j["release"] for j in jobs) - t_go
    picks = sorted(j["pick"] for j in jobs)[slots:]
    releases = sorted(j["release"] for j in jobs)[: len(picks)]
    refill = [max(0.0, p - r) for p, r in zip(picks, releases)]
    res = {
        "kind": kind,
        "n": n,
        "procs": procs,
        "slots": slots,
        "hold": hold,
        "wall": wall,
        "ideal": ideal(holds, slots),
        "util": sum(holds) / (slots * wall),
        "refill_p50": pct(refill, 0.5),
        "refill_p99": pct(refill, 0.99),
    }
    if kind == "ledger":
        waits = [w for s in stats for w in s["lock_waits"]]
        holds_ = [h for s in stats for h in s.get("lock_holds", [])]
        res.update(
            txn=sum(s["commits"] for s in stats) / n,
            writes=sum(s["writes"] for s in stats) / n,
            busy=sum(s["busy"] for s in stats),
            lock_p50=pct(waits, 0.5),
            lock_p99=pct(waits, 0.99),
            locks=len(waits),
            hold_p50=pct(holds_, 0.5),
            hold_p99=pct(holds_, 0.99),
        )
    if os.environ.get("BENCH_WAITERS_KEEP"):
        (Path(os.environ["BENCH_WAITERS_KEEP"]) / f"{kind}-{n}.json").write_text(
            json.dumps({"t_go": t_go, "jobs": jobs})
        )
    shutil.rmtree(run, ignore_errors=True)
    return res


# -- databases and the Prefect server ------------------------------------------------------------
def pg_schema(base: str) -> tuple[str, callable]:
    import psycopg

    from lane_plugin.ledger.url import parse_url

    kwargs = dict(parse_url(base).conninfo)
    name = "bw_" + uuid.uuid4().hex[:10]
    with psycopg.connect(**kwargs, autocommit=True) as conn:
        conn.execute(f'create schema "{name}"')

    def drop() -> None:
        with psycopg.connect(**kwargs, autocommit=True) as conn:
            conn.execute(f'drop schema if exists "{name}" cascade')

    sep = "&" if "?" in base else "?"
    return f"{base}{sep}options={quote('-csearch_path=' + name)}", drop


class PrefectServer:
    """``prefect server start`` in its own session and PREFECT_HOME; stopped (the whole group) on exit."""

    def __init__(self, home: Path):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}/api"
        self.env = {
            **os.environ,
            "PREFECT_HOME": str(home),
            "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
            "PREFECT_API_URL": self.url,
        }
        prefect = str(Path(sys.executable).with_name("prefect"))
        self.proc = subprocess.Popen(
            [prefect, "server", "start", "--host", "127.0.0.1", "--port", str(self.port)],
            env={k: v for k, v in self.env.items() if k != "PREFECT_API_URL"},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        end = time.monotonic() + 180
        while time.monotonic() < end:
            try:
                urllib.request.urlopen(self.url + "/health", timeout=2).read()
                return
            except Exception:
                if self.proc.poll() is not None:
                    break
                time.sleep(0.5)
        self.stop()
        raise SystemExit("prefect server start did not come up")

    def limit(self, slots: int) -> None:
        prefect = str(Path(sys.executable).with_name("prefect"))
        subprocess.run([prefect, "gcl", "delete", GCL], env=self.env, input="y\n", capture_output=True, text=True)
        subprocess.run(
            [prefect, "gcl", "create", GCL, "--limit", str(slots)], env=self.env, check=True, capture_output=True
        )

    def stop(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=20)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


# -- report --------------------------------------------------------------------------------------
def verdict(ok: bool) -> str:
    return "**met**" if ok else "**missed**"


def row(label: str, r: dict) -> str:
    if "wall" not in r:
        return f"| {label} | {r['n']} | {r['procs']} | {r['slots']} | {r['hold']} | did not finish in {r['timeout']:.0f} s | | | | | | |"
    txn = f"{r['txn']:.1f} ({r['writes']:.1f} writes)" if "txn" in r else "n/a"
    lock = f"{r['lock_p50'] * 1e3:.1f} / {r['lock_p99'] * 1e3:.1f} ms" if "lock_p50" in r else "n/a"
    hold = f"{r['hold_p50'] * 1e3:.1f} / {r['hold_p99'] * 1e3:.1f} ms" if "hold_p50" in r else "n/a"
    return (
        f"| {label} | {r['n']} | {r['procs']} | {r['slots']} | {r['hold']} s | {r['wall']:.2f} s "
        f"({r['wall'] / r['ideal']:.2f}x of {r['ideal']:.1f}) | {r['util']:.0%} | {txn} | {lock} | {hold} | "
        f"{r['refill_p50'] * 1e3:.0f} / {r['refill_p99'] * 1e3:.0f} ms |"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--quick", action="store_true", help="smaller counts: 200 waiters instead of 1,000")
    ap.add_argument("--db", default="sqlite,postgresql", help="databases to run (comma-separated)")
    ap.add_argument("--only", default="target,mixed,many", help="scenarios: target, mixed, many")
    ap.add_argument(
        "--pg",
        default=os.environ.get(
            "LANE_BENCH_POSTGRES_URL",
            os.environ.get("LANE_TEST_POSTGRES_URL", "postgresql+psycopg://root@127.0.0.1:5432/test"),
        ),
        help="PostgreSQL database to run in (a fresh schema per run, dropped after); default "
        "$LANE_BENCH_POSTGRES_URL, else $LANE_TEST_POSTGRES_URL, else .../5432/test",
    )
    ap.add_argument("--no-prefect", action="store_true", help="skip Prefect's concurrency() and its server")
    ap.add_argument("--no-write", action="store_true", help=f"do not write {DOC.relative_to(ROOT)}")
    args = ap.parse_args()
    if args.worker:
        worker(json.loads(args.worker))
        return
    many = 200 if args.quick else 1000
    scenarios = {  # name: (n, procs, slots, hold)
        "target": (80, 2, 10, "1.0"),
        "mixed": (60 if args.quick else 120, 2, 10, "0.1:5.0"),
        "many": (many, 4, 50, "0.1:5.0"),
    }
    chosen = [s for s in args.only.split(",") if s in scenarios]
    dbs = [d for d in args.db.split(",") if d in ("sqlite", "postgresql")]
    tmp = Path(tempfile.mkdtemp(prefix="bench-waiters-"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API")}
    env.update(PYTHONPATH=str(ROOT), PREFECT_SERVER_ANALYTICS_ENABLED="false", PREFECT_HOME=str(tmp / "home"))
    server = None if args.no_prefect else PrefectServer(tmp / "server-home")
    results: list[tuple[str, str, dict]] = []
    try:
        if server is not None:
            env["PREFECT_API_URL"] = server.url
        for name in chosen:
            n, procs, slots, hold = scenarios[name]
            if name == "many" and "postgresql" not in dbs:
                continue
            for db in dbs if name != "many" else ["postgresql"]:
                if db == "sqlite":
                    url, drop = f"sqlite:///{tmp / (name + '.db')}", (lambda: None)
                else:
                    url, drop = pg_schema(args.pg)
                try:
                    r = run_once("ledger", url, n, procs, slots, hold, env, tmp, timeout=600)
                finally:
                    drop()
                results.append((name, f"lane gate, {db}", r))
                print(row(f"{name}: lane gate, {db}", r), flush=True)
            if server is not None and name != "many":
                server.limit(slots)
                r = run_once(
                    "prefect", None, n, procs, slots, hold, {**env, **{"PREFECT_API_URL": server.url}}, tmp, timeout=600
                )
                results.append((name, "Prefect concurrency(occupy=1)", r))
                print(row(f"{name}: Prefect concurrency(occupy=1)", r), flush=True)
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    lines = targets(results)
    for line in lines:
        print(line)
    if not args.no_write:
        write(results, lines, args)


def targets(results) -> list[str]:
    out = []
    for name, label, r in results:
        if "wall" not in r or not label.startswith("lane gate"):
            continue
        db = label.split(", ")[1]
        if name == "target":
            out.append(
                f"- 80 jobs x 1 s on 10 slots from 2 processes, {db}: wall {r['wall']:.2f} s (target <= 9.2 s) "
                f"{verdict(r['wall'] <= 9.2)}; {r['txn']:.1f} transactions per job (target <= 10) "
                f"{verdict(r['txn'] <= 10)}"
            )
        if name == "many":
            out.append(
                f"- {r['n']} waiters in {r['procs']} processes, {db}: slot refill p99 {r['refill_p99'] * 1e3:.0f} ms "
                f"(target < 50 ms) {verdict(r['refill_p99'] < 0.05)}; lane-lock wait p99 "
                f"{r['lock_p99'] * 1e3:.1f} ms (target < 50 ms) {verdict(r['lock_p99'] < 0.05)}"
            )
    return out


def write(results, lines, args) -> None:
    cmd = "python benchmarks/bench_waiters.py" + (" --quick" if args.quick else "")
    if args.db != "sqlite,postgresql":
        cmd += f" --db {args.db}"
    if args.only != "target,mixed,many":
        cmd += f" --only {args.only}"
    if args.no_prefect:
        cmd += " --no-prefect"
    head = [
        "## Waiters: hand-off, wake-ups and one ticker per lane",
        "",
        f"Command: `{cmd}`",
        "",
        f"Machine: {platform.node()}: {os.cpu_count()} cores, Python {platform.python_version()}; "
        "wall from the start signal (workers already imported) to the last release.",
        "",
        "| scenario | jobs | processes | slots | hold | wall (x ideal) | slot use | transactions per job "
        "| lane-lock wait p50 / p99 | lane-lock hold p50 / p99 | slot refill p50 / p99 |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    body = [row(f"{name}: {label}", r) for name, label, r in results]
    old = DOC.read_text() if DOC.exists() else ""
    kept = old[old.index(NOTES) :] if NOTES in old else ""  # the notes written by hand below the tables
    DOC.write_text(
        "\n".join(head + body + ["", "Targets (issue 14):", ""] + lines) + "\n" + ("\n" + kept if kept else "")
    )
    print(f"wrote {DOC.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
