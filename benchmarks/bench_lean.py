"""How strongly ``lane`` must lean towards small jobs to meet issue 11's wait targets (an experiment).

Replays the rate-bound scenarios of ``bench_targets.py`` (Azure and Mooncake, a 60 s sliding window a
little under the hour's demand) with ``lane_plugin.policy.order.priority`` replaced (in the simulator's queue) by candidate leans, each adding
at most ``max_wait_seconds`` to a job's place (so each keeps the wait bound: a job arriving more than
``max_wait_seconds`` later is never ahead), and prints `lane`'s p50 and p99 wait against
`token-fifo`'s (targets: <= 0.5x and <= 1.3x). Class boundaries are quantiles of the trace's own
estimates: what a lane would have to learn from its traffic (the ledger does not store it yet).

Run:  .venv/bin/python benchmarks/bench_lean.py [--leans today,q50,q60,...] [--scenarios rate-azure,...]

Leans: ``shipped`` (the lane as it is: two classes by a boundary learned at each refit, lane_plugin.policy.sizeclass);
``today`` (the one continuous priority: est x max_wait / min(ceiling, burst)); ``qNN``: two classes,
jobs above the NN-th percentile estimate wait ``max_wait_seconds`` more; ``qAA/BB``: three classes;
``linNN``: linear in est up to twice the NN-th percentile, then flat; ``burst/K``: linear up to
min(ceiling, burst) / K (a scale from the lane's settings, not its traffic); ``learnedNN``: ``qNN``
with the boundary learned as a lane would, the NN-th percentile of the last 500 estimates submitted,
refreshed every REFIT_SECONDS (the continuous priority until 50 are known): what ``shipped`` does, but
refreshed at a submission rather than at the refit after a tick, and for stages of runs under way too.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections import deque
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import bench_targets as bt  # noqa: E402

from lane_plugin.policy.order import priority  # noqa: E402
from lane_plugin.policy.reserve import REFIT_SECONDS  # noqa: E402
from lane_plugin.sim import lanequeue as lq  # noqa: E402
from lane_plugin.sim.engine import simulate  # noqa: E402

TODAY = priority
DEFAULT = "shipped,today,burst/64,burst/128,lin50,q50,q60,q70,q33/67,learned60"
LEARN_FROM, LEARN_MIN = 500, 50


def learning(pct: float):
    """A ``LaneQueue.push`` placing each job by a boundary learned from the estimates submitted before it."""
    push = lq.LaneQueue.push

    def learned_push(q, j: int) -> None:
        st = q.__dict__.setdefault("_lean", {"recent": deque(maxlen=LEARN_FROM), "bound": 0, "at": -math.inf})
        sim, p = q.sim, q.policy
        now = sim.waiting_since[j]
        if now - st["at"] >= REFIT_SECONDS:
            ranked = sorted(st["recent"])
            st["bound"] = ranked[min(len(ranked) - 1, int(pct / 100 * len(ranked)))] if len(ranked) >= LEARN_MIN else 0
            st["at"] = now
        if j not in q._prio:  # placed once, at intake (a requeued job keeps its place)
            est = sim.est[j]
            q._prio[j] = now + (
                (p.max_wait_seconds if est > st["bound"] else 0.0) if st["bound"] else est * p.age_factor
            )
            st["recent"].append(est)
        push(q, j)

    return push, learned_push


def lean(name: str, ests: list[int]):
    """A priority function ``(policy, est, wait_since, boundary, finishing) -> prio`` for lean ``name`` on these
    estimates (the lane's own boundary is kept None while it runs)."""
    ranked = sorted(ests)

    def q(pct: float) -> int:
        return ranked[min(len(ranked) - 1, int(pct / 100 * len(ranked)))]

    if name == "today":
        return TODAY
    if name.startswith("burst/"):
        k = float(name[6:])
        return lambda p, est, w, b=None, f=False: (
            w + p.max_wait_seconds * min(1.0, est / max(1.0, min(p.ceiling, p.burst_tokens) / k))
        )
    if name.startswith("lin"):
        scale = 2 * q(float(name[3:]))
        return lambda p, est, w, b=None, f=False: w + p.max_wait_seconds * min(1.0, est / scale)
    if name.startswith("q"):
        bounds = [q(float(x)) for x in name[1:].split("/")]
        return lambda p, est, w, b=None, f=False: w + p.max_wait_seconds * sum(est > x for x in bounds) / len(bounds)
    raise SystemExit(f"--leans: unknown lean {name!r}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--leans", default=DEFAULT)
    ap.add_argument(
        "--scenarios",
        default="rate-azure,rate-mooncake",
        help="bench_targets scenarios (chained-budget runs its 2-day --quick form)",
    )
    args = ap.parse_args()
    print(
        "| scenario | lean | `lane` p50 | `token-fifo` p50 | ratio | `lane` p99 | `token-fifo` p99 | ratio "
        "| runs done (`token-fifo`) | stranded |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name in args.scenarios.split(","):
        trace = bt.traffic(name, True)
        cfg = bt.config(name, trace)
        fifo = simulate(trace, cfg, ["token-fifo"])[0]
        for lean_name in args.leans.split(","):
            push, learn = lq.LaneQueue.push, lq.size_class_boundary
            if lean_name != "shipped":
                lq.size_class_boundary = lambda ests: None  # the lean below places every job
            if lean_name.startswith("learned"):
                push, lq.LaneQueue.push = learning(float(lean_name[7:]))
            elif lean_name != "shipped":
                lq.priority = lean(lean_name, trace.est)
            try:
                lane = simulate(trace, cfg, ["lane"])[0]
            finally:
                lq.priority, lq.LaneQueue.push, lq.size_class_boundary = TODAY, push, learn
            print(
                f"| {name} | `{lean_name}` | {lane.wait_p50:.0f} s | {fifo.wait_p50:.0f} s | "
                f"{lane.wait_p50 / fifo.wait_p50:.2f}x | {lane.wait_p99:.0f} s | {fifo.wait_p99:.0f} s | "
                f"{lane.wait_p99 / fifo.wait_p99:.2f}x | {lane.runs_finished:,} ({fifo.runs_finished:,}) | "
                f"{100 * lane.stranded_tokens / max(1, lane.spent):.2f}% |",
                flush=True,
            )


if __name__ == "__main__":
    main()
