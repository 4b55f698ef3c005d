"""Backfill vs interactive: two tenants of one lane, through real Prefect runs in two processes (issue 23).

    python benchmarks/bench_tenants.py                 # 2,000 backfill jobs, a 5-job run every 30 s
    python benchmarks/bench_tenants.py --quick         # 500 jobs: about 7 minutes
    python benchmarks/bench_tenants.py --db postgresql+psycopg://root@127.0.0.1:5432/test

One ``prefect server start`` and one ledger (a temporary SQLite file, or ``--db``) are shared by two OS
processes, each running a real Prefect flow of ``@lane_task(tenant=...)`` tasks whose bodies sleep
``--ms-per-1k`` ms per 1,000 tokens and report their tokens as usage:

- process A, tenant ``backfill``: one flow submitting ``--jobs`` jobs of ``--size`` tokens at once;
- process B, tenant ``interactive``: a flow run of 5 jobs of ``--size`` tokens every ``--every`` seconds,
  for as long as the backfill runs.

The lane's sliding burst window (``--rate`` tokens/s: ``burst_tokens = rate x window``) binds: its
``max_leased`` slots could run ``max_leased x 1000 / ms-per-1k`` tokens/s, several times the rate, so the
backfill alone saturates the lane. Phases, in one run: B alone on the empty lane (each run's completion
time: its baseline), A alone (its tokens per second, first body start to last body end), A and B together,
and A and B together once more as **one** tenant (``shared``): the lane's tenant order has nothing to
choose between, so its own order (equal sizes: first come, first served) is the baseline obeying the
same limits. Targets: the interactive runs' completion p99 <= 2x its p99 alone, the backfill's tokens
per second >= 95% of its rate alone.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

LANE = "shared"
RUN_JOBS = 5


def lane_settings(rate: float, window: float, max_leased: int, max_wait: float) -> dict:
    burst = int(rate * window)
    return dict(allowance=10**12, ceiling=10**12, start_fraction=1.0, burst_tokens=burst, window_seconds=window,
                max_leased=max_leased, max_wait_seconds=max_wait)  # fmt: skip


# ---------------------------------------------------------------- the two processes


def make_task(db: str, tenant: str, size: int, ms_per_1k: float):
    from lane_plugin import lane_task

    @lane_task(stage="llm", estimate=size, lane=LANE, ledger=db, tenant=tenant, usage=lambda r: r["tokens"])
    def call(i: int) -> dict:
        t0 = time.time()
        time.sleep(size / 1000 * ms_per_1k / 1000)  # a provider call taking time in proportion to its tokens
        return {"tokens": size, "start": t0, "end": time.time()}

    return call


def child_backfill(a: argparse.Namespace) -> dict:
    from prefect import flow

    call = make_task(a.db, a.tenant, a.size, a.ms_per_1k)

    @flow(name="backfill")
    def backfill(n: int) -> list[dict]:
        futures = [call.submit(i) for i in range(n)]
        Path(a.go).touch()  # every job is in the ledger's queue: the interactive process may start
        return [f.result() for f in futures]

    t0 = time.time()
    out = backfill(a.jobs)
    start, end = min(r["start"] for r in out), max(r["end"] for r in out)
    tokens = sum(r["tokens"] for r in out)
    return {"jobs": len(out), "tokens": tokens, "seconds": end - start, "rate": tokens / (end - start),
            "flow_seconds": time.time() - t0}  # fmt: skip


def child_interactive(a: argparse.Namespace) -> dict:
    from prefect import flow

    call = make_task(a.db, a.tenant, a.size, a.ms_per_1k)

    @flow(name="interactive")
    def interactive(k: int) -> list[dict]:
        return [f.result() for f in [call.submit(k * RUN_JOBS + i) for i in range(RUN_JOBS)]]

    interactive(-1)  # warm-up (imports, connections): not measured
    if a.go:
        while not Path(a.go).exists():
            time.sleep(0.1)
    times, k, next_at = [], 0, time.monotonic()
    while True:
        if a.runs and k >= a.runs:
            break
        if a.stop and Path(a.stop).exists():
            break
        time.sleep(max(0.0, next_at - time.monotonic()))
        if a.stop and Path(a.stop).exists():
            break
        next_at += a.every
        t0 = time.monotonic()
        interactive(k)
        times.append(time.monotonic() - t0)
        k += 1
    return {"runs": len(times), "times": times}


# ---------------------------------------------------------------- the orchestrator


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))]


def spawn(env: dict, tmp: Path, name: str, *args: str) -> tuple[subprocess.Popen, Path]:
    out = tmp / f"{name}.json"
    log = (tmp / f"{name}.log").open("w")
    p = subprocess.Popen([sys.executable, __file__, "--child-out", str(out), *args], env=env, stdout=log,
                         stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
    return p, out


def collect(p: subprocess.Popen, out: Path, tmp: Path, name: str, timeout: float) -> dict:
    try:
        rc = p.wait(timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, 9)
        raise SystemExit(f"{name} did not finish in {timeout:.0f} s; log: {tmp / (name + '.log')}") from None
    if rc != 0 or not out.exists():
        raise SystemExit(f"{name} failed ({rc}):\n{(tmp / (name + '.log')).read_text()[-3000:]}")
    return json.loads(out.read_text())


def reset_lane(db: str, settings: dict, weight: float) -> None:
    from lane_plugin import Ledger

    led = Ledger(db)
    led.set_lane(LANE, **settings)
    led.set_tenant(LANE, "interactive", weight=weight)
    led.close()


def phases(a: argparse.Namespace, env: dict, tmp: Path) -> dict:
    common = ["--db", a.db, "--size", str(a.size), "--ms-per-1k", str(a.ms_per_1k)]
    budget = 120 + 3 * a.jobs * a.size / a.rate  # generous: the backfill alone takes jobs x size / rate
    res: dict = {}

    print(f"phase 1/4: interactive alone, {a.alone_runs} runs", flush=True)
    p, out = spawn(env, tmp, "i-alone", "--child", "interactive", "--tenant", "interactive", "--runs",
                   str(a.alone_runs), "--every", str(min(a.every, 5.0)), *common)  # fmt: skip
    res["i_alone"] = collect(p, out, tmp, "i-alone", budget)

    print(f"phase 2/4: backfill alone, {a.jobs} jobs", flush=True)
    p, out = spawn(env, tmp, "b-alone", "--child", "backfill", "--tenant", "backfill", "--jobs", str(a.jobs),
                   "--go", str(tmp / "go-0"), *common)  # fmt: skip
    res["b_alone"] = collect(p, out, tmp, "b-alone", budget)

    for n, (label, b_tenant, i_tenant) in enumerate(
        (("fair", "backfill", "interactive"), ("fcfs", "shared-tenant", "shared-tenant")), start=1
    ):
        print(f"phase {2 + n}/4: both, {'two tenants' if label == 'fair' else 'one tenant (FCFS)'}", flush=True)
        go, stop = tmp / f"go-{n}", tmp / f"stop-{n}"
        pb, outb = spawn(env, tmp, f"b-{label}", "--child", "backfill", "--tenant", b_tenant, "--jobs",
                         str(a.jobs), "--go", str(go), *common)  # fmt: skip
        pi, outi = spawn(env, tmp, f"i-{label}", "--child", "interactive", "--tenant", i_tenant, "--go", str(go),
                         "--stop", str(stop), "--every", str(a.every), *common)  # fmt: skip
        res[f"b_{label}"] = collect(pb, outb, tmp, f"b-{label}", budget)
        stop.touch()
        res[f"i_{label}"] = collect(pi, outi, tmp, f"i-{label}", budget)
    return res


def render(a: argparse.Namespace, r: dict, command: str) -> str:
    ia, ba = r["i_alone"]["times"], r["b_alone"]["rate"]
    p50a, p99a = pct(ia, 0.5), pct(ia, 0.99)
    lines = [
        f"Command: `{command}`", "",
        f"Lane: {a.rate:.0f} tokens/s ({int(a.rate * a.window)} tokens per {a.window:g} s sliding window), "
        f"max_leased {a.max_leased}, max_wait_seconds {a.max_wait:g} (a job is due after "
        f"{a.max_wait * a.size / (a.rate * a.window):.0f} s); jobs of {a.size} tokens whose bodies sleep {a.ms_per_1k:g} ms per 1,000 "
        f"(the slots could run {a.max_leased * 1e6 / a.ms_per_1k:.0f} tokens/s: the window binds); "
        f"interactive weight {a.weight:g}; ledger {a.db.split(':', 1)[0]}; {os.cpu_count()} cores, shared.", "",
        f"Interactive alone: {len(ia)} runs of {RUN_JOBS} jobs, completion p50 {p50a:.2f} s, p99 {p99a:.2f} s. "
        f"Backfill alone: {r['b_alone']['jobs']} jobs, {ba:.0f} tokens/s over {r['b_alone']['seconds']:.1f} s.", "",
        "| order | interactive runs | completion p50 | p99 | p99 / alone (target <= 2x) "
        "| backfill tokens/s | / alone (target >= 0.95) |",
        "|---|---|---|---|---|---|---|",
    ]  # fmt: skip
    verdicts = {}
    for label, name in (
        ("fair", "tenants (`backfill`, `interactive`)"),
        ("fcfs", "one tenant (first come, first served)"),
    ):
        it, b = r[f"i_{label}"]["times"], r[f"b_{label}"]["rate"]
        if not it:
            lines.append(f"| {name} | 0 | - | - | - | {b:.0f} | {b / ba:.3f} |")
            continue
        p99 = pct(it, 0.99)
        verdicts[label] = (p99 / p99a, b / ba)
        lines.append(f"| {name} | {len(it)} | {pct(it, 0.5):.2f} s | {p99:.2f} s | {p99 / p99a:.2f}x "
                     f"| {b:.0f} | {b / ba:.3f} |")  # fmt: skip
    lines.append("")
    if "fair" in verdicts:
        x, y = verdicts["fair"]
        lines.append(
            f"{'met   ' if x <= 2 else 'MISSED'} interactive completion p99 <= 2x alone, with tenants ({x:.2f}x)"
        )
        lines.append(
            f"{'met   ' if y >= 0.95 else 'MISSED'} backfill tokens/s >= 0.95 of alone, with tenants ({y:.3f})"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=2000, help="backfill jobs submitted at once (default 2000)")
    ap.add_argument("--every", type=float, default=30.0, help="seconds between interactive runs (default 30)")
    ap.add_argument("--quick", action="store_true", help="500 jobs: a run of about 7 minutes")
    ap.add_argument("--db", default=None, help="ledger URL (default: a temporary SQLite file)")
    ap.add_argument("--rate", type=float, default=5000.0, help="the lane's tokens per second (default 5000)")
    ap.add_argument("--window", type=float, default=2.0, help="burst window seconds (default 2)")
    ap.add_argument("--max-leased", type=int, default=8)
    ap.add_argument("--size", type=int, default=1000, help="tokens per job, both tenants (default 1000)")
    ap.add_argument("--ms-per-1k", type=float, default=400.0, help="body sleep per 1,000 tokens (default 400)")
    ap.add_argument("--weight", type=float, default=1.0, help="the interactive tenant's weight (default 1)")
    ap.add_argument(
        "--max-wait",
        type=float,
        default=600.0,
        help="the lane's max_wait_seconds (default 600, the lane default): a job is *due* after "
        "max_wait x size / burst_tokens seconds, and due jobs go first, whatever their tenant",
    )
    ap.add_argument("--alone-runs", type=int, default=8, help="interactive runs on the empty lane (default 8)")
    # the child processes
    ap.add_argument("--child", choices=("backfill", "interactive"), help=argparse.SUPPRESS)
    ap.add_argument("--child-out", help=argparse.SUPPRESS)
    ap.add_argument("--tenant", help=argparse.SUPPRESS)
    ap.add_argument("--go", help=argparse.SUPPRESS)
    ap.add_argument("--stop", help=argparse.SUPPRESS)
    ap.add_argument("--runs", type=int, default=0, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        out = child_backfill(a) if a.child == "backfill" else child_interactive(a)
        Path(a.child_out).write_text(json.dumps(out))
        return 0
    if a.quick and a.jobs == 2000:
        a.jobs = 500
    for name in (
        "jobs",
        "every",
        "rate",
        "window",
        "max_leased",
        "max_wait",
        "size",
        "ms_per_1k",
        "weight",
        "alone_runs",
    ):
        if getattr(a, name) <= 0:
            ap.error(f"--{name.replace('_', '-')} must be positive, got {getattr(a, name)}")
    tmp = Path(tempfile.mkdtemp(prefix="bench-tenants-"))
    a.db = a.db or f"sqlite:///{tmp / 'lane.db'}"
    reset_lane(a.db, lane_settings(a.rate, a.window, a.max_leased, a.max_wait), a.weight)
    from lane_plugin.testing.prefect_server import real_server

    t0 = time.monotonic()
    with real_server(tmp) as (_api, env):
        env["PREFECT_LOGGING_LEVEL"] = "WARNING"
        env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
        r = phases(a, env, tmp)
    command = "python benchmarks/bench_tenants.py" + "".join(
        f" {x}" for x in (argv if argv is not None else sys.argv[1:])
    )
    print(f"\n({time.monotonic() - t0:.0f} s)\n")
    print(render(a, r, command))
    from lane_plugin import Ledger

    led = Ledger(a.db)
    problems = led.audit()
    led.close()
    print("ledger audit:", problems or "sound")
    if not problems:
        shutil.rmtree(tmp, ignore_errors=True)  # the Prefect server's database and the logs: ~70 MB a quick run
    return 0 if not problems else 1


if __name__ == "__main__":
    sys.exit(main())
