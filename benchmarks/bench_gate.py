"""What gating costs a Prefect task: plain @task against @lane_task against Prefect's concurrency().

    python benchmarks/bench_gate.py                  # 200 tasks, 3 rounds; writes docs/performance_gate.md
    python benchmarks/bench_gate.py --tasks 50 --rounds 1 --no-write
    python benchmarks/bench_gate.py --profile        # cProfile of one @lane_task flow, top 25 by cumulative

In one process, on Prefect's ephemeral server (a fresh PREFECT_HOME) and a fresh
SQLite ledger, a flow calls N trivial tasks one after another:

(a)  plain ``@task``;
(a') plain ``@task`` with the two tags a gated task carries (``lane:``, ``stage:``):
     Prefect checks tag concurrency limits for every tagged task run, which is a
     cost of the tags themselves, shown separately;
(b)  ``@lane_task`` on the SQLite ledger (intake, admission, lease, settlement,
     two ledger events forwarded to Prefect);
(b') ``@lane_task(..., lane_tags=False)``: the same gate without the two tags, so
     without their tag-concurrency lookups;
(c)  plain ``@task`` whose body holds ``concurrency("bench-gate", occupy=est)``
     from ``prefect.concurrency.sync`` on a global concurrency limit that always has room.

Rounds of (a), (a'), (b) and (b') are interleaved after a warm-up flow of each and
the median wall time is reported; (c) costs about 2 s per task on Prefect 3.9
here, so it runs once (``--c-tasks`` to shorten it; its time is then scaled). Targets: (b)/(a) <= 1.25, and
the gate's overhead per task (b - a) at least 5x smaller than Prefect's (c - a).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
DOC = ROOT / "docs" / "performance_gate.md"
LIMIT = "bench-gate"
EST = 10


MISSED_WHY = """### Where (b)'s time goes

Prefect acquires concurrency slots for the tags of a task run before its body
runs (`task_engine.py`: `_concurrency(names=[f"tag:{{tag}}" ...], lease_duration=60)`):
a run with any tag makes an acquire (all its tags in one call, with a lease) and
a release round trip to the server, even when no limit exists; a run without
tags skips both. So a task carrying the `lane:` and `stage:` tags, which the gate
puts on every gated run by default, pays that cost: (a') - (a) = {tags:.1f} ms per
task here. The gate's own work above a task with the same tags (intake,
admission, lease, settlement and two events) is (b) - (a') = {own:+.1f} ms per
task, (b)/(a') = **{own_ratio:.2f}**. `lane_task(..., lane_tags=False)` drops
the tags, and with them the lookup when the task has no tags of its own:
(b')/(a) = **{bare_ratio:.2f}** (target 1.25: {bare_verdict}), (b') - (a) =
{bare:+.1f} ms per task."""


def build(url: str):
    """The four task variants and a flow factory running N calls of one of them."""
    from prefect import flow, task
    from prefect.concurrency.sync import concurrency

    from lane_plugin import lane_task

    @task
    def plain(i: int) -> int:
        return EST

    @task(tags=["lane:bench", "stage:bench"])
    def tagged(i: int) -> int:
        return EST

    @lane_task(stage="bench", estimate=EST, lane="bench", ledger=url)
    def gated(i: int) -> int:
        return EST  # the usage: an int is read as tokens

    @lane_task(stage="bench", estimate=EST, lane="bench", ledger=url, lane_tags=False)
    def gated_bare(i: int) -> int:
        return EST

    @task
    def prefect_gated(i: int) -> int:
        with concurrency(LIMIT, occupy=EST):
            return EST

    variants = {"a": plain, "a'": tagged, "b": gated, "b'": gated_bare, "c": prefect_gated}

    def runner(key: str, n: int):
        fn = variants[key]

        @flow(name=f"bench-gate-{key.replace(chr(39), 'p')}")
        def run() -> int:
            return sum(fn(i) for i in range(n))

        return run

    return runner


def setup(url: str) -> None:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate

    from lane_plugin import Ledger

    Ledger(url).set_lane(
        "bench", allowance=10**12, ceiling=10**12, start_fraction=1.0, burst_tokens=10**9, max_leased=100_000
    )
    with get_client(sync_client=True) as client:
        client.create_global_concurrency_limit(GlobalConcurrencyLimitCreate(name=LIMIT, limit=10**6))


def _children_cpu() -> float:
    """CPU seconds used so far by this process's children (the ephemeral Prefect server)."""
    total, me = 0, str(os.getpid())
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[1] == me:  # ppid
            total += int(fields[11]) + int(fields[12])  # utime + stime, in clock ticks
    return total / os.sysconf("SC_CLK_TCK")


def settle_server(limit: float = 60.0) -> None:
    """Flush this process's events and wait until the server has finished recording them,
    so that no flow pays for the previous flow's backlog (the server shares the cores)."""
    from prefect.events.worker import EventsWorker

    EventsWorker.instance().wait_until_empty()
    end, last = time.monotonic() + limit, _children_cpu()
    while time.monotonic() < end:
        time.sleep(0.5)
        now = _children_cpu()
        if now - last < 0.03:  # the server used under 6% of a core for half a second: idle
            return
        last = now


def measure(runner, n: int, rounds: int, n_c: int) -> dict[str, float]:
    """Median flow wall time per variant; (c) runs once, with ``n_c`` tasks, scaled to ``n``."""
    for key in ("a", "a'", "b", "b'", "c"):  # warm-up: imports, server caches, connections
        assert runner(key, 5)() == 5 * EST
    walls: dict[str, list[float]] = {k: [] for k in ("a", "a'", "b", "b'")}
    for _ in range(rounds):
        for key in walls:
            flow_fn = runner(key, n)
            settle_server()
            t0 = time.perf_counter()
            assert flow_fn() == n * EST
            walls[key].append(time.perf_counter() - t0)
    out = {k: statistics.median(v) for k, v in walls.items()}
    flow_fn = runner("c", n_c)
    settle_server()
    t0 = time.perf_counter()
    assert flow_fn() == n_c * EST
    out["c"] = (time.perf_counter() - t0) * n / n_c
    return out


def render(walls: dict[str, float], n: int, rounds: int, command: str, n_c: int) -> str:
    a, b, c = walls["a"], walls["b"], walls["c"]
    over_b, over_c = (b - a) / n * 1000, (c - a) / n * 1000
    ratio = b / a
    per_task = (c / n) / (b / n)
    speedup = over_c / over_b if over_b > 0 else float("inf")
    names = {
        "a": "(a) plain `@task`",
        "a'": "(a') `@task` with the gate's two tags",
        "b": "(b) `@lane_task` (SQLite ledger)",
        "b'": "(b') `@lane_task(..., lane_tags=False)`",
        "c": '(c) `@task` + `concurrency("...", occupy=est)`',
    }
    rows = [
        f"| {names[k]} | {w:.2f} s | {w / n * 1000:.1f} ms | {(w - a) / n * 1000:+.1f} ms |" for k, w in walls.items()
    ]
    verdict_1 = "met" if ratio <= 1.25 else "MISSED"
    verdict_2 = "met" if speedup >= 5 else "MISSED"
    return "\n".join(
        [
            "## Gated task overhead",
            "",
            f"Command: `{command}`",
            "",
            f"Machine: {platform.node()}: {os.cpu_count()} cores, Python {platform.python_version()}, "
            f"{platform.platform()}; Prefect ephemeral server, SQLite ledger; {n} sequential tasks per flow, "
            f"median of {rounds} interleaved rounds of (a), (a'), (b), (b'); (c) is one flow of {n_c} tasks"
            + (f" scaled to {n}" if n_c != n else "")
            + ".",
            "",
            "| variant | flow wall time | per task | overhead per task vs (a) |",
            "|---|---|---|---|",
            *rows,
            "",
            f"- (b)/(a) wall time: **{ratio:.2f}** (target <= 1.25: {verdict_1})",
            f"- gating overhead per task: (b) {over_b:.1f} ms vs (c) {over_c:.1f} ms: (b) is **{speedup:.1f}x** "
            f"cheaper (target >= 5x: {verdict_2}); whole task, (c)/(b) = {per_task:.2f}",
            "",
            MISSED_WHY.format(
                tags=(walls["a'"] - a) / n * 1000,
                own=(b - walls["a'"]) / n * 1000,
                own_ratio=b / walls["a'"],
                bare_ratio=walls["b'"] / a,
                bare=(walls["b'"] - a) / n * 1000,
                bare_verdict="met" if walls["b'"] / a <= 1.25 else "MISSED",
            ),
        ]
    )


def profile(runner, n: int) -> None:
    import cProfile
    import pstats

    runner("b", 5)()
    prof = cProfile.Profile()
    flow_fn = runner("b", n)
    prof.enable()
    flow_fn()
    prof.disable()
    pstats.Stats(prof).sort_stats("cumulative").print_stats(25)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=200, help="tasks per flow (default 200)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds; the median is kept (default 3)")
    parser.add_argument(
        "--c-tasks",
        type=int,
        default=None,
        help="tasks in the one (c) flow (default --tasks; it takes ~2 s per task here)",
    )
    parser.add_argument("--no-write", action="store_true", help=f"print only; do not write {DOC.name}")
    parser.add_argument("--profile", action="store_true", help="profile one @lane_task flow instead")
    args = parser.parse_args(argv)
    if args.tasks < 1 or args.rounds < 1:
        parser.error("--tasks and --rounds must be at least 1")
    tmp = Path(tempfile.mkdtemp(prefix="bench-gate-"))
    os.environ["PREFECT_HOME"] = str(tmp / "prefect")  # a fresh ephemeral server: no history to slow it
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
    url = f"sqlite:///{tmp / 'lane.db'}"
    runner = build(url)
    setup(url)
    if args.profile:
        profile(runner, args.tasks)
        return 0
    n_c = args.c_tasks or args.tasks
    walls = measure(runner, args.tasks, args.rounds, n_c)
    command = "python benchmarks/bench_gate.py" + "".join(
        f" {a}" for a in (argv if argv is not None else sys.argv[1:]) if a != "--no-write"
    )
    text = render(walls, args.tasks, args.rounds, command, n_c)
    print(text)
    if not args.no_write:
        DOC.write_text(text + "\n")
        print(f"\nwrote {DOC.relative_to(ROOT)}")
    from lane_plugin import Ledger

    problems = Ledger(url).audit()
    print("ledger audit:", problems or "sound")
    return 0 if not problems else 1


if __name__ == "__main__":
    sys.exit(main())
