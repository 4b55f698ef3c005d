"""The simulator's speed per policy in CPU seconds, so a shared, loaded machine still compares fairly.

Runs one scenario of ``bench_targets.py`` once per policy and prints simulated jobs per CPU second
(``time.process_time``) and each policy's ratio to ``token-fifo`` in the same run. ``--root DIR``
imports ``lane_plugin`` from another checkout (e.g. ``git archive main lane_plugin benchmarks | tar
-x -C /tmp/main``) to compare before and after on the same traffic.

Run:  .venv/bin/python benchmarks/bench_sim_speed.py [--scenario chained-budget] [--quick] [--root DIR]
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
args = ap.parse_args()
sys.path[:0] = [str(args.root), str(args.root / "benchmarks")]

import bench_targets as bt  # noqa: E402

from lane_plugin.sim.engine import simulate  # noqa: E402

trace = bt.traffic(args.scenario, args.quick)
cfg = bt.config(args.scenario, trace)
speed = {}
for name in args.policies.split(","):
    cpu = time.process_time()
    result = simulate(trace, cfg, [name])[0]
    speed[name] = result.jobs / (time.process_time() - cpu)
base = speed.get("token-fifo")
cells = [f"{n} {s:,.0f} jobs/cpu-s" + (f" ({s / base:.2f}x token-fifo)" if base and n != "token-fifo" else "")
         for n, s in speed.items()]  # fmt: skip
print(f"{args.scenario} from {args.root}: " + "; ".join(cells) + f"; load average {os.getloadavg()[0]:.2f}")
