"""Backfill vs interactive: two tenants of one lane, through real Prefect runs in two processes (issue 23).

    python benchmarks/bench_tenants.py                 # 2,000 backfill jobs, a 5-job run every 30 s
    python benchmarks/bench_tenants.py --quick         # 500 jobs: about 7 minutes
    python benchmarks/bench_tenants.py --db postgresql+psycopg://root@127.0.0.1:5432/test
    python benchmarks/bench_tenants.py --quick --server-db postgres   # the Prefect server on PostgreSQL

One ``prefect server start`` and one ledger (a temporary SQLite file, or ``--db``) are shared by two OS
processes, each running a real Prefect flow of ``@lane_task(tenant=...)`` tasks whose bodies sleep
``--ms-per-1k`` ms per 1,000 tokens and report their tokens as usage:

- process A, tenant ``backfill``: one flow submitting ``--jobs`` jobs of ``--size`` tokens at once;
- process B, tenant ``interactive``: a flow run of 5 jobs of ``--size`` tokens every ``--every`` seconds,
  from the moment A's flow has submitted its tasks, for as long as the backfill runs. (Prefect starts a
  flow's submitted task runs a few a second on a busy machine, so the backfill reaches the ledger over
  minutes: with ``--go-when-queued`` B starts once every backfill job is in the ledger instead.)

The lane's sliding burst window (``--rate`` tokens/s: ``burst_tokens = rate x window``) binds: its
``max_leased`` slots could run ``max_leased x 1000 / ms-per-1k`` tokens/s, several times the rate, so the
backfill alone saturates the lane. Phases, in one run: B alone on the empty lane (each run's completion
time: its baseline), A alone (its tokens per second, first body start to last body end), A and B together,
and A and B together once more as **one** tenant (``shared``): the lane's tenant order has nothing to
choose between, so its own order (equal sizes: first come, first served) is the baseline obeying the
same limits. Targets: the interactive runs' completion p99 <= 2x its p99 alone, the backfill's tokens
per second >= 95% of its rate alone.

The Prefect server keeps its database in SQLite (``--server-db sqlite``, Prefect's default) or in a fresh
PostgreSQL database created for the run and dropped after it (``--server-db postgres``, on the server of
``--server-pg-url``): what a team running a 2,000-task backfill would deploy. The interactive process times
its own runs (the flow call to its body: Prefect creating the flow run and setting it Running; its CPU seconds)
and, from a thread with its own HTTP client, one small read of the server every second (the server's answer
time, apart from Prefect's client).
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
sys.path.insert(0, str(ROOT / "benchmarks"))

from tenants_server import SERVER_DBS, prefect_task_runs, server_database  # noqa: E402

LANE = "shared"
RUN_JOBS = 5


def lane_settings(rate: float, window: float, max_leased: int, max_wait: float) -> dict:
    burst = int(rate * window)
    return dict(
        allowance=10**12,
        ceiling=10**12,
        start_fraction=1.0,
        burst_tokens=burst,
        window_seconds=window,
        max_leased=max_leased,
        max_wait_seconds=max_wait,
    )


# ---------------------------------------------------------------- the two processes


def make_task(db: str, tenant: str, size: int, ms_per_1k: float, lane_tags: bool = True):
    from lane_plugin import lane_task

    @lane_task(
        stage="llm",
        estimate=size,
        lane=LANE,
        ledger=db,
        tenant=tenant,
        usage=lambda r: r["tokens"],
        lane_tags=lane_tags,
    )
    def call(i: int) -> dict:
        t0 = time.time()
        time.sleep(size / 1000 * ms_per_1k / 1000)  # a provider call taking time in proportion to its tokens
        return {"tokens": size, "start": t0, "end": time.time()}

    return call


def child_backfill(a: argparse.Namespace) -> dict:
    from prefect import flow

    call = make_task(a.db, a.tenant, a.size, a.ms_per_1k, not a.no_lane_tags)

    @flow(name="backfill")
    def backfill(n: int) -> dict:
        from prefect.runtime import flow_run

        futures = [call.submit(i) for i in range(n)]
        submitted = time.time()
        if a.go_when_queued:  # Prefect starts the task runs a few a second: wait until every job is in the ledger
            while queued(a.db, str(flow_run.id)) < n and not all(f.state.is_final() for f in futures):
                time.sleep(0.2)
        queued_at = time.time()
        Path(a.go).touch()  # the interactive process may start
        return {
            "run": str(flow_run.id),
            "jobs": [f.result() for f in futures],
            "submitted": submitted,
            "queued": queued_at,
        }

    t0 = time.time()
    res = backfill(a.jobs)
    out = res["jobs"]
    start, end = min(r["start"] for r in out), max(r["end"] for r in out)
    tokens = sum(r["tokens"] for r in out)
    return {
        "jobs": len(out),
        "tokens": tokens,
        "seconds": end - start,
        "rate": tokens / (end - start),
        "flow_seconds": time.time() - t0,
        "run": res["run"],
        "start": start,
        "end": end,
        "queued_after": res["queued"] - res["submitted"],
    }


def queued(db: str, run: str) -> int:
    """How many jobs of flow run ``run`` the ledger has (intake done: queued, leased or settled)."""
    import sqlalchemy as sa

    engine = sa.create_engine(db)
    try:
        with engine.connect() as c:
            return int(c.execute(sa.text("select count(*) from job where run_key = :r"), {"r": run}).scalar() or 0)
    finally:
        engine.dispose()


def child_interactive(a: argparse.Namespace) -> dict:
    from prefect import flow

    call = make_task(a.db, a.tenant, a.size, a.ms_per_1k, not a.no_lane_tags)

    @flow(name="interactive")
    def interactive(k: int) -> dict:
        from prefect.runtime import flow_run

        body = time.time()  # Prefect has created the flow run and set it Running
        jobs = [f.result() for f in [call.submit(k * RUN_JOBS + i) for i in range(RUN_JOBS)]]
        return {"run": str(flow_run.id), "jobs": jobs, "body": body}

    interactive(-1)  # warm-up (imports, connections): not measured
    if a.go:
        while not Path(a.go).exists():
            time.sleep(0.1)
    from prefect.settings import PREFECT_API_URL
    from tenants_server import ApiProbe

    with ApiProbe(str(PREFECT_API_URL.value())) as probe:
        out = interactive_runs(a, interactive)
    return {**out, "probe": probe.samples}


def interactive_runs(a: argparse.Namespace, interactive) -> dict:
    times, runs, k, next_at = [], [], 0, time.monotonic()
    while True:
        if a.runs and k >= a.runs:
            break
        if a.stop and Path(a.stop).exists():
            break
        time.sleep(max(0.0, next_at - time.monotonic()))
        if a.stop and Path(a.stop).exists():
            break
        next_at += a.every
        t0, w0, c0 = time.monotonic(), time.time(), time.process_time()
        out = interactive(k)
        times.append(time.monotonic() - t0)
        runs.append(
            {
                "run": out["run"],
                "start": w0,
                "end": time.time(),
                "body": out["body"],
                "cpu": time.process_time() - c0,
                "bodies": [(j["start"], j["end"]) for j in out["jobs"]],
            }
        )
        k += 1
    return {"runs": len(times), "times": times, "trace": runs}


# ---------------------------------------------------------------- the orchestrator


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))]


def spawn(env: dict, tmp: Path, name: str, *args: str) -> tuple[subprocess.Popen, Path]:
    out = tmp / f"{name}.json"
    log = (tmp / f"{name}.log").open("w")
    p = subprocess.Popen(
        [sys.executable, __file__, "--child-out", str(out), *args],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
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


def reset_lane(db: str, settings: dict) -> None:
    from lane_plugin import Ledger

    led = Ledger(db)
    led.set_lane(LANE, **settings)
    led.close()


def set_weight(db: str, weight: float) -> None:
    """The interactive tenant's weight for the next phase (what ``lane tenants set shared interactive --weight``
    does)."""
    from lane_plugin import Ledger

    led = Ledger(db)
    led.set_tenant(LANE, "interactive", weight=weight)
    led.close()


def fair_label(weight: float) -> str:
    return f"fair-w{weight:g}"


def labels(a: argparse.Namespace) -> list[str]:
    """The phases with an interactive process, in order: alone, one per weight, first come first served."""
    return ["alone", *(fair_label(w) for w in a.weights), "fcfs"]


def floor_seconds(a: argparse.Namespace) -> float:
    """How much longer than alone an interactive run must take beside a backfill that keeps the lane full, in any
    order that obeys the lane's limits: even first in line, each of its jobs waits for room (the window frees
    ``rate`` tokens a second; the slots free ``max_leased`` jobs per body time), where alone they all fit at once."""
    body = a.size / 1000 * a.ms_per_1k / 1000
    return RUN_JOBS * max(a.size / a.rate, body / a.max_leased)


def phases(a: argparse.Namespace, env: dict, tmp: Path) -> dict:
    common = ["--db", a.db, "--size", str(a.size), "--ms-per-1k", str(a.ms_per_1k)]
    common += ["--no-lane-tags"] if a.no_lane_tags else []
    common += ["--go-when-queued"] if a.go_when_queued else []
    budget = 120 + 3 * a.jobs * a.size / a.rate  # generous: the backfill alone takes jobs x size / rate
    res: dict = {}

    print(f"phase 1/{3 + len(a.weights)}: interactive alone, {a.alone_runs} runs", flush=True)
    p, out = spawn(
        env,
        tmp,
        "i-alone",
        "--child",
        "interactive",
        "--tenant",
        "interactive",
        "--runs",
        str(a.alone_runs),
        "--every",
        str(min(a.every, 5.0)),
        *common,
    )
    res["i_alone"] = collect(p, out, tmp, "i-alone", budget)

    print(f"phase 2/{3 + len(a.weights)}: backfill alone, {a.jobs} jobs", flush=True)
    p, out = spawn(
        env,
        tmp,
        "b-alone",
        "--child",
        "backfill",
        "--tenant",
        "backfill",
        "--jobs",
        str(a.jobs),
        "--go",
        str(tmp / "go-0"),
        *common,
    )
    res["b_alone"] = collect(p, out, tmp, "b-alone", budget)

    shared = [(fair_label(w), "backfill", "interactive", w) for w in a.weights]
    shared.append(("fcfs", "shared-tenant", "shared-tenant", 1.0))
    for n, (label, b_tenant, i_tenant, weight) in enumerate(shared, start=1):
        what = f"two tenants, interactive weight {weight:g}" if label != "fcfs" else "one tenant (FCFS)"
        print(f"phase {2 + n}/{2 + len(shared)}: both, {what}", flush=True)
        set_weight(a.db, weight)
        go, stop = tmp / f"go-{n}", tmp / f"stop-{n}"
        pb, outb = spawn(
            env,
            tmp,
            f"b-{label}",
            "--child",
            "backfill",
            "--tenant",
            b_tenant,
            "--jobs",
            str(a.jobs),
            "--go",
            str(go),
            *common,
        )
        pi, outi = spawn(
            env,
            tmp,
            f"i-{label}",
            "--child",
            "interactive",
            "--tenant",
            i_tenant,
            "--go",
            str(go),
            "--stop",
            str(stop),
            "--every",
            str(a.every),
            *common,
        )
        res[f"b_{label}"] = collect(pb, outb, tmp, f"b-{label}", budget)
        stop.touch()
        res[f"i_{label}"] = collect(pi, outi, tmp, f"i-{label}", budget)
    return res


def render(a: argparse.Namespace, r: dict, command: str) -> str:
    ia, ba = r["i_alone"]["times"], r["b_alone"]["rate"]
    p50a, p99a = pct(ia, 0.5), pct(ia, 0.99)
    lines = [
        f"Command: `{command}`",
        "",
        f"Lane: {a.rate:.0f} tokens/s ({int(a.rate * a.window)} tokens per {a.window:g} s sliding window), "
        f"max_leased {a.max_leased}, max_wait_seconds {a.max_wait:g} (a job is due after "
        f"{a.max_wait * a.size / (a.rate * a.window):.0f} s); jobs of {a.size} tokens whose bodies sleep {a.ms_per_1k:g} ms per 1,000 "
        f"(the slots could run {a.max_leased * 1e6 / a.ms_per_1k:.0f} tokens/s: "
        f"{'the window binds' if a.max_leased * 1e6 / a.ms_per_1k > a.rate else 'the slots bind'}); "
        f"tasks {'without' if a.no_lane_tags else 'with'} the lane's tags; "
        + (
            "rule 12 on its learning day (binding nothing); "
            if a.overtake_q is None
            else f"rule 12 on its second day (slack 1.25, Q seeded {a.overtake_q:,}); "
        )
        + f"ledger {a.db.split(':', 1)[0]}; Prefect server database {a.server_db}; {os.cpu_count()} cores, shared.",
        "",
        f"Interactive alone: {len(ia)} runs of {RUN_JOBS} jobs, completion p50 {p50a:.2f} s, p99 {p99a:.2f} s. "
        f"Backfill alone: {r['b_alone']['jobs']} jobs, {ba:.0f} tokens/s over {r['b_alone']['seconds']:.1f} s. "
        f"The interactive runs start {'once every backfill job is in the ledger (--go-when-queued)' if a.go_when_queued else 'when the backfill has submitted its tasks'}.",
        "",
        "| order | interactive runs | completion p50 | p99 | p99 / alone (target <= 2x) "
        "| backfill tokens/s | / alone (target >= 0.95) |",
        "|---|---|---|---|---|---|---|",
    ]
    floor = p99a + floor_seconds(a)
    lines.append(
        f"| floor: the run first in line, every time (computed, not run) | - | - | {floor:.2f} s | "
        f"{floor / p99a:.2f}x | - | - |"
    )
    verdicts = {}
    for label in labels(a)[1:]:
        name = (
            "one tenant (first come, first served)"
            if label == "fcfs"
            else f"tenants, `interactive` weight {label.removeprefix('fair-w')}"
        )
        it, b = r[f"i_{label}"]["times"], r[f"b_{label}"]["rate"]
        if not it:
            lines.append(f"| {name} | 0 | - | - | - | {b:.0f} | {b / ba:.3f} |")
            continue
        p99 = pct(it, 0.99)
        verdicts[label] = (p99 / p99a, b / ba)
        lines.append(
            f"| {name} | {len(it)} | {pct(it, 0.5):.2f} s | {p99:.2f} s | {p99 / p99a:.2f}x | {b:.0f} | {b / ba:.3f} |"
        )
    lines += [
        "",
        f"The floor: beside a backfill that keeps the lane full, each of the run's {RUN_JOBS} jobs waits for room "
        f"(the window frees {a.rate:.0f} tokens/s; alone they all fit at once), so no order that obeys the lane's limits "
        f"finishes the run sooner than its time alone + {floor_seconds(a):.2f} s. At weight w the run's jobs share "
        f"the room with the backfill's, about w : 1 (the tenant order's bound: docs/sharing-a-lane.md).",
        "",
    ]
    for label, (x, y) in verdicts.items():
        if label == "fcfs":
            continue
        w = label.removeprefix("fair-w")
        lines.append(
            f"{'met   ' if x <= 2 else 'MISSED'} interactive completion p99 <= 2x alone, weight {w} ({x:.2f}x)"
        )
        lines.append(f"{'met   ' if y >= 0.95 else 'MISSED'} backfill tokens/s >= 0.95 of alone, weight {w} ({y:.3f})")
    return "\n".join(lines)


def ledger_jobs(db: str) -> list[tuple]:
    """Every job of the lane as ``(tenant, run_key, est, created_at, admitted_at, finished_at)``."""
    import sqlalchemy as sa

    engine = sa.create_engine(db)
    try:
        with engine.connect() as c:
            sql = "select tenant, run_key, est, created_at, admitted_at, finished_at from job where lane = :l"
            return [tuple(row) for row in c.execute(sa.text(sql), {"l": LANE})]
    finally:
        engine.dispose()


def where_time_goes(a: argparse.Namespace, r: dict, jobs: list[tuple], tasks: dict) -> list[str]:
    """Where the interactive runs' time goes, and how full the lane kept, from the ledger's own rows.

    Per interactive run (the child's wall clock around the flow call, the Prefect server's task runs, the ledger's
    timestamps, the bodies' own): ``flow start`` from the flow call to the flow's body (Prefect creating the flow
    run and setting it Running, from the process's own clock), ``task runs to Running`` from there to the last of
    its task runs' Running state (for a tagged task the tag-concurrency call first; the client's timestamp: the
    server records task runs from events, later), ``intake`` from there to the last of its jobs' intake in the
    ledger, ``ledger wait`` from each job's intake to its lease (the longest), ``to body`` from the lease to the
    body's start, ``after`` from the last body's end to the flow's return; ``CPU`` the interactive process's CPU
    seconds over the run; ``backfill leased`` the backfill jobs leased between the run's first intake and its last
    lease. Per phase with a backfill: the lane's tokens leased per second over the backfill's leasing span against
    the rate, and the interactive tenant's share of them. Then the server's answer time to the interactive
    process's probe (:class:`tenants_server.ApiProbe`) per phase.
    """
    by_run: dict[str, list[tuple]] = {}
    for j in jobs:
        by_run.setdefault(j[1], []).append(j)
    lines = [
        "",
        "Where the time goes (from the ledger's rows; mean over the phase's runs, then its slowest run):",
        "",
        "| phase | runs | total | flow start (Prefect) | task runs to Running (Prefect) | intake "
        "| ledger wait (longest job) | lease to body | body | after the last body | CPU of the process "
        "| backfill jobs leased meanwhile |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    backfill_runs = {r[f"b_{k}"]["run"] for k in labels(a) if f"b_{k}" in r}
    for label in labels(a):
        rows = []
        for t in r[f"i_{label}"].get("trace", []):
            own = [j for j in by_run.get(t["run"], []) if j[4] is not None]
            if not own:
                continue
            first_in, last_in, last_lease = min(j[3] for j in own), max(j[3] for j in own), max(j[4] for j in own)
            wait = max(j[4] - j[3] for j in own)
            bodies = t["bodies"]
            to_body = max(b[0] for b in bodies) - last_lease
            body = max(b[1] - b[0] for b in bodies)
            after = t["end"] - max(b[1] for b in bodies)
            meanwhile = sum(
                1
                for run in backfill_runs
                for j in by_run.get(run, [])
                if j[4] is not None and first_in <= j[4] <= last_lease
            )
            running = max((x[1] for x in tasks.get(t["run"], [])), default=math.nan)
            rows.append(
                (
                    t["end"] - t["start"],
                    t["body"] - t["start"],
                    running - t["body"],
                    last_in - running,
                    wait,
                    to_body,
                    body,
                    after,
                    t["cpu"],
                    meanwhile,
                )
            )
        if not rows:
            continue
        mean = [sum(x[i] for x in rows) / len(rows) for i in range(10)]
        worst = max(rows)
        for name, v in (("mean", mean), ("slowest", worst)):
            lines.append(
                f"| {label} ({name}) | {len(rows)} | " + " | ".join(f"{x:.2f} s" for x in v[:9]) + f" | {v[9]:.0f} |"
            )
    lines += [
        "",
        "The server's answer to one small read (`POST /flow_runs/filter`, limit 1) from the interactive "
        "process, once a second while its runs went on:",
        "",
        "| phase | reads | p50 | p99 | slowest |",
        "|---|---|---|---|---|",
    ]
    for label in labels(a):
        xs = [x[1] for x in r[f"i_{label}"].get("probe", [])]
        if xs:
            lines.append(
                f"| {label} | {len(xs)} | {pct(xs, 0.5) * 1000:.0f} ms | {pct(xs, 0.99) * 1000:.0f} ms | "
                f"{max(xs) * 1000:.0f} ms |"
            )
    lines += [
        "",
        "The lane over each backfill (its jobs' intake: when Prefect had started their task runs):",
        "",
        "| phase | backfill intake span | intake jobs/s | leasing span | lane tokens leased/s (rate "
        + f"{a.rate:.0f}) | interactive share | backfill tokens/s by bodies |",
        "|---|---|---|---|---|---|---|",
    ]
    for label in labels(a):
        b = r.get(f"b_{label}")
        if b is None:
            continue
        mine = [j for j in by_run.get(b["run"], []) if j[4] is not None]
        lo, hi = min(j[4] for j in mine), max(j[4] for j in mine)
        intake = max(j[3] for j in mine) - min(j[3] for j in mine)
        inside = [j for j in jobs if j[4] is not None and lo <= j[4] <= hi]
        total = sum(j[2] for j in inside)
        others = total - sum(j[2] for j in mine)
        span = max(hi - lo, 1e-9)
        lines.append(
            f"| {label} | {intake:.1f} s | {len(mine) / max(intake, 1e-9):.1f} | {span:.1f} s | "
            f"{total / span:.0f} | {others / max(total, 1):.3f} | {b['rate']:.0f} |"
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=2000, help="backfill jobs submitted at once (default 2000)")
    ap.add_argument("--every", type=float, default=30.0, help="seconds between interactive runs (default 30)")
    ap.add_argument("--quick", action="store_true", help="500 jobs: a run of about 7 minutes")
    ap.add_argument("--db", default=None, help="ledger URL (default: a temporary SQLite file)")
    ap.add_argument("--rate", type=float, default=5000.0, help="the lane's tokens per second (default 5000)")
    ap.add_argument("--window", type=float, default=2.0, help="burst window seconds (default 2)")
    ap.add_argument(
        "--max-leased",
        type=int,
        default=16,
        help="the lane's lease slots (default 16: with 2 s calls the window binds)",
    )
    ap.add_argument("--size", type=int, default=1000, help="tokens per job, both tenants (default 1000)")
    ap.add_argument(
        "--overtake-q",
        type=int,
        default=None,
        help="rule 12 (lane overtake_slack 1.25, the default) with its p99 backlog seeded at this many rate tokens: "
        "the lane on its second day (default: none seeded, the lane's learning day, where the rule binds nothing)",
    )
    ap.add_argument(
        "--ms-per-1k",
        type=float,
        default=2000.0,
        help="body sleep per 1,000 tokens (default 2000: a provider call of 1,000 tokens taking 2 s)",
    )
    ap.add_argument(
        "--weights",
        "--weight",
        default="1,4",
        help="the interactive tenant's weights, one phase each (default 1,4: equal, and the weight 4 of "
        "`lane tenants set free interactive --weight 4`)",
    )
    ap.add_argument(
        "--max-wait",
        type=float,
        default=600.0,
        help="the lane's max_wait_seconds (default 600, the lane default): a job is *due* after "
        "max_wait x size / burst_tokens seconds, and due jobs go first, whatever their tenant",
    )
    ap.add_argument(
        "--go-when-queued",
        action="store_true",
        help="start the interactive runs once every backfill job is in the ledger's queue, not as soon as the "
        "backfill's flow has submitted its tasks (when they race Prefect's start of the backfill's task runs)",
    )
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory (ledger, Prefect's database)")
    ap.add_argument(
        "--no-lane-tags",
        action="store_true",
        help="tasks without the lane:/stage: tags: Prefect then skips its tag-concurrency call at each task run's start",
    )
    ap.add_argument(
        "--server-db",
        choices=SERVER_DBS,
        default="sqlite",
        help="the Prefect server's database: sqlite (its default, a file) or postgres (a fresh database "
        "on --server-pg-url's server, dropped after the run)",
    )
    ap.add_argument(
        "--server-pg-url",
        default=os.environ.get(
            "LANE_BENCH_POSTGRES_URL",
            os.environ.get("LANE_TEST_POSTGRES_URL", "postgresql://root@127.0.0.1:5432/postgres"),
        ),
        help="a PostgreSQL URL whose server holds --server-db postgres's database (any driver; "
        "default LANE_BENCH_POSTGRES_URL, else LANE_TEST_POSTGRES_URL)",
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
        "alone_runs",
    ):
        if getattr(a, name) <= 0:
            ap.error(f"--{name.replace('_', '-')} must be positive, got {getattr(a, name)}")
    try:
        a.weights = [float(w) for w in a.weights.split(",")]
    except ValueError:
        ap.error(f"--weights must be numbers separated by commas, got {a.weights!r}")
    if not a.weights or min(a.weights) <= 0:
        ap.error(f"--weights must be positive, got {a.weights}")
    tmp = Path(tempfile.mkdtemp(prefix="bench-tenants-"))
    a.db = a.db or f"sqlite:///{tmp / 'lane.db'}"
    rule = {} if a.overtake_q is None else {"overtake_slack": 1.25, "overtake_q": a.overtake_q}
    reset_lane(a.db, {**lane_settings(a.rate, a.window, a.max_leased, a.max_wait), **rule})
    from lane_plugin.testing.prefect_server import real_server

    t0 = time.monotonic()
    with server_database(tmp, a.server_db, a.server_pg_url) as (db_env, server_url):
        with real_server(tmp, **db_env) as (_api, env):
            env["PREFECT_LOGGING_LEVEL"] = "WARNING"
            env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
            r = phases(a, env, tmp)
        tasks = prefect_task_runs(server_url)
    command = "python benchmarks/bench_tenants.py" + "".join(
        f" {x}" for x in (argv if argv is not None else sys.argv[1:])
    )
    print(f"\n({time.monotonic() - t0:.0f} s)\n")
    print(render(a, r, command))
    print("\n".join(where_time_goes(a, r, ledger_jobs(a.db), tasks)))
    from lane_plugin import Ledger

    led = Ledger(a.db)
    problems = led.audit()
    led.close()
    print("ledger audit:", problems or "sound")
    if not problems and not a.keep:
        shutil.rmtree(tmp, ignore_errors=True)  # the Prefect server's database and the logs: ~70 MB a quick run
    return 0 if not problems else 1


if __name__ == "__main__":
    sys.exit(main())
