"""The simulator's speed per policy in CPU seconds, so a shared, loaded machine still compares fairly.

Runs one scenario of ``bench_targets.py`` once per policy and prints simulated jobs per CPU second
(``time.process_time``) and each policy's ratio to ``token-fifo`` in the same run. ``--root DIR``
imports ``lane_plugin`` from another checkout (e.g. ``git archive main lane_plugin benchmarks | tar
-x -C /tmp/main``) to compare before and after on the same traffic.

``--floor`` also prints the engine's floor for ``lane``: the same run replayed with every tick's
decision (what ``lane`` leased, and the window room it waited for) read back from a list, so
nothing is decided and no lane bookkeeping is kept. The jobs per CPU second ``lane`` could reach
with a policy that cost nothing is at most that figure.

The first line says whether ``lane_plugin`` ran as pure Python or which of its modules ran compiled
(a mypyc build in place: docs/performance.md, "Compiled with mypyc").

Run:  .venv/bin/python benchmarks/bench_sim_speed.py [--scenario chained-budget] [--quick] [--root DIR] [--floor]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
ap.add_argument("--scenario", default="chained-budget")
ap.add_argument("--quick", action="store_true", help="the 2-day chained scenario instead of the week")
ap.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[1])
ap.add_argument("--policies", default="token-fifo,lane")
ap.add_argument("--floor", action="store_true", help="also replay lane's decisions: the engine's floor")
args = ap.parse_args()
sys.path[:0] = [str(args.root), str(args.root / "benchmarks")]

import bench_targets as bt  # noqa: E402

from lane_plugin.sim import policies  # noqa: E402
from lane_plugin.sim.engine import Sim, simulate  # noqa: E402
from lane_plugin.sim.gcpause import paused_gc  # noqa: E402


def build() -> str:
    """Whether lane_plugin runs compiled (an in-place mypyc build leaves a .so beside each source: docs/performance.md)."""
    compiled = sorted(
        m
        for m, mod in list(sys.modules.items())
        if m.startswith("lane_plugin") and (getattr(mod, "__file__", None) or "").endswith((".so", ".pyd"))
    )
    if not compiled:
        return "pure Python"
    return f"compiled: {', '.join(m.removeprefix('lane_plugin.') for m in compiled)}"


trace = bt.traffic(args.scenario, args.quick)
cfg = bt.config(args.scenario, trace)
speed = {}
for name in args.policies.split(","):
    cpu = time.process_time()
    result = simulate(trace, cfg, [name])[0]
    speed[name] = result.jobs / (time.process_time() - cpu)
base = speed.get("token-fifo")
cells = [
    f"{n} {s:,.0f} jobs/cpu-s" + (f" ({s / base:.2f}x token-fifo)" if base and n != "token-fifo" else "")
    for n, s in speed.items()
]
print(f"{args.scenario} from {args.root} ({build()}): " + "; ".join(cells) + f"; load average {os.getloadavg()[0]:.2f}")


def floor() -> None:
    """Replay lane's decisions tick by tick under a policy that only reads them back."""
    decisions: list = []
    lane = policies.POLICIES["lane"]

    def recording(sim, now):
        decisions.append(lane(sim, now))
        return decisions[-1]

    policies.POLICIES["lane"] = recording
    try:
        cpu = time.process_time()
        live = simulate(trace, cfg, ["lane"])[0]
        live_s = time.process_time() - cpu
    finally:
        policies.POLICIES["lane"] = lane
    replayed = iter(decisions)
    policies.POLICIES["replay"] = lambda sim, now: next(replayed)
    try:
        cpu = time.process_time()
        with paused_gc():
            again = Sim(trace, cfg, "replay").run()
        floor_s = time.process_time() - cpu
    finally:
        del policies.POLICIES["replay"]
    if (again.done, again.parked) != (live.done, live.parked):
        raise SystemExit(
            f"the replay diverged: done {again.done} vs {live.done}, parked {again.parked} vs {live.parked}"
        )
    print(
        f"{args.scenario}: lane {live.jobs / live_s:,.0f} jobs/cpu-s ({live_s:.2f} cpu-s); the engine replaying "
        f"its {len(decisions):,} decisions {again.jobs / floor_s:,.0f} jobs/cpu-s ({floor_s:.2f} cpu-s): the policy "
        f"costs {live_s - floor_s:.2f} cpu-s, {1e6 * (live_s - floor_s) / len(decisions):.1f} us per tick; "
        f"load average {os.getloadavg()[0]:.2f}"
    )


if args.floor:
    floor()
