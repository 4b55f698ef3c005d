"""Benchmark the targets of issue 11 on real traces: every policy, the same limits, one run.

Prints a table per scenario and the targets, each with the figure that meets
or misses it, and writes ``docs/performance_targets.md`` (the section
``benchmarks/run_all.py`` puts into ``docs/performance.md``).

Run:  .venv/bin/python benchmarks/bench_targets.py [--quick] [--no-write] [--tenants SPEC] [--overtake-beta B|off]
      [--overtake-slack C|off]

Scenarios (every policy under the same lease cap and the same sliding burst
window; the real traces are read with est = input + 256 and rate_cost =
input + 2048, see lane_plugin/sim/readers.py):

- ``ceiling-azure`` / ``ceiling-mooncake``: real single calls (Azure code
  trace, Mooncake conversation trace), the ceiling half of the hour's demand,
  rate and worker ample;
- ``chained-budget``: generated 3-stage runs (lognormal, drift 1.3), chained,
  ~1.5x a daily 8M ceiling, a 6 h deadline, a week (``--quick``: 2 days);
- ``rate-azure`` / ``rate-mooncake``: budget ample, a 60 s sliding window a
  little under the hour's average rate_cost demand;
- ``worker-azure`` / ``worker-mooncake``: budget and rate ample, the worker
  ~90% loaded; busy % over the hour of arrivals (``--horizon``).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from lane_plugin.sim import report as sim_report  # noqa: E402
from lane_plugin.sim.config import SimConfig  # noqa: E402
from lane_plugin.sim.engine import simulate  # noqa: E402
from lane_plugin.sim.readers import load_trace  # noqa: E402
from lane_plugin.sim.tenants import assign_by_hash, parse_tenants  # noqa: E402
from lane_plugin.sim.traffic import generate  # noqa: E402

TRACES = Path(os.environ.get("LANE_TRACES", "/work/shared/traces"))
AZURE = TRACES / "AzureLLMInferenceTrace_code.csv"
MOONCAKE = TRACES / "mooncake_conversation.csv"
DOC = ROOT / "docs" / "performance_targets.md"
FAST = dict(service_base=0.5, service_per_output_token=0.02, lease_seconds=900.0, window_seconds=60.0)
AMPLE = 10**12
JOBS_PER_DAY = 100_000 / 7  # the chained week of docs/performance_simulate.md

SCENARIOS = {
    "ceiling-azure": dict(
        trace=AZURE,
        cfg=dict(FAST, ceiling=9_000_000, allowance=10_000_000, burst_tokens=5_000_000, max_leased=64, workers=64),
    ),
    "ceiling-mooncake": dict(
        trace=MOONCAKE,
        cfg=dict(FAST, ceiling=75_000_000, allowance=80_000_000, burst_tokens=50_000_000, max_leased=64, workers=64),
    ),
    # issue 12: the same replays, each call re-estimated at arrival by `learned` (input + the learned mean
    # output of the calls settled so far), admission keeping headroom for the spread in flight (2 sigma)
    "ceiling-azure-learned": dict(
        trace=AZURE,
        cfg=dict(
            FAST,
            ceiling=9_000_000,
            allowance=10_000_000,
            burst_tokens=5_000_000,
            max_leased=64,
            workers=64,
            estimator="learned",
        ),
    ),
    "ceiling-mooncake-learned": dict(
        trace=MOONCAKE,
        cfg=dict(
            FAST,
            ceiling=75_000_000,
            allowance=80_000_000,
            burst_tokens=50_000_000,
            max_leased=64,
            workers=64,
            estimator="learned",
        ),
    ),
    "chained-budget": dict(
        generated=dict(mix="lognormal", drift=1.3, seed=1, stages=3, median=400.0),
        cfg=dict(
            ceiling=8_000_000,
            allowance=10_000_000,
            burst_tokens=40_000,
            window_seconds=1.0,
            max_leased=8,
            lease_seconds=900.0,
            period_seconds=86_400.0,
            workers=4,
            service_base=4.0,
            service_per_token=0.023,
            deadline=21_600.0,
        ),
    ),
    "rate-azure": dict(
        trace=AZURE, cfg=dict(FAST, ceiling=AMPLE, allowance=AMPLE, burst_tokens=600_000, max_leased=64, workers=64)
    ),
    "rate-mooncake": dict(
        trace=MOONCAKE,
        cfg=dict(FAST, ceiling=AMPLE, allowance=AMPLE, burst_tokens=2_800_000, max_leased=64, workers=64),
    ),
    "worker-azure": dict(
        trace=AZURE,
        horizon=True,
        cfg=dict(FAST, ceiling=AMPLE, allowance=AMPLE, burst_tokens=5_000_000, max_leased=8, workers=3),
    ),
    "worker-mooncake": dict(
        trace=MOONCAKE,
        horizon=True,
        cfg=dict(FAST, ceiling=AMPLE, allowance=AMPLE, burst_tokens=50_000_000, max_leased=32, workers=28),
    ),
}


def days_for(quick: bool) -> float:
    return 2.0 if quick else 7.0


# --tenants NAME:WEIGHT:SHARE,...: the same scenarios with the lane shared by these tenants, each request
# (a trace row, a generated run) given one by hashing its id (lane_plugin.sim.tenants.assign_by_hash).
TENANTS: list[tuple[str, float, float]] = []
# --overtake-slack C|off: rule 12's slack (default: the lane's, LANE_DEFAULTS["overtake_slack"], on its second day:
# SimConfig.overtake_day); --overtake-beta B|off: the pointwise budget's beta instead (an exploration, with the
# index heads it was measured with); "off": the order alone.
OVERTAKE: list[dict] = [{}]


def traffic(name: str, quick: bool):
    spec = SCENARIOS[name]
    if "trace" in spec:
        trace = load_trace(spec["trace"])
    else:
        days = days_for(quick)
        trace = generate(round(JOBS_PER_DAY * days), days=days, **spec["generated"])
    if TENANTS:
        trace.tenant = list(assign_by_hash([rk or f"req-{i}" for i, rk in enumerate(trace.run_key)], TENANTS))
    return trace


def config(name: str, trace) -> SimConfig:
    spec = SCENARIOS[name]
    extra = {"horizon": math.ceil(trace.span)} if spec.get("horizon") else {}
    return SimConfig(**spec["cfg"], **extra, tenant_weights=tuple((n, w) for n, w, _ in TENANTS), **OVERTAKE[0])


def command(name: str, trace, cfg: SimConfig, quick: bool) -> str:
    """The ``lane simulate`` line that prints the same table."""
    spec = SCENARIOS[name]
    if "trace" in spec:
        src = f"--trace {spec['trace']}"
    else:
        g = spec["generated"]
        days = days_for(quick)
        src = (
            f"--jobs {round(JOBS_PER_DAY * days)} --days {days:g} --mix {g['mix']} --drift {g['drift']} "
            f"--seed {g['seed']} --stages {g['stages']} --median {g['median']:g}"
        )
    flags = {k: v for k, v in spec["cfg"].items()}
    if cfg.horizon is not None:
        flags["horizon"] = cfg.horizon
    period = flags.pop("period_seconds", None)
    out = [f"lane simulate {src}"]
    out += [
        f"--{k.replace('_', '-')} {v:g}" if isinstance(v, float) else f"--{k.replace('_', '-')} {v}"
        for k, v in flags.items()
    ]
    if period:
        out.append("--period daily")
    return " ".join(out)


def run(name: str, quick: bool) -> dict:
    trace = traffic(name, quick)
    cfg = config(name, trace)
    wall = time.perf_counter()
    results = simulate(trace, cfg)
    wall = time.perf_counter() - wall
    tenants = " --tenants " + ",".join(f"{n}:{w:g}:{s:g}" for n, w, s in TENANTS) if TENANTS else ""
    print(f"\n## {name}\n$ {command(name, trace, cfg, quick)}{tenants}")
    sim_report.print_table(trace, cfg, results, wall)
    return {"name": name, "trace": trace, "cfg": cfg, "results": {r.policy: r for r in results}, "wall": wall}


def _ratio(a: float, b: float) -> float:
    if b == 0:
        return 0.0 if a == 0 else math.inf
    return a / b


def targets(runs: dict[str, dict]) -> list[tuple[str, str, bool]]:
    """(target, what was measured, met) for every target of issue 11 the simulator can measure."""
    out = []
    for name in ("ceiling-azure", "ceiling-mooncake"):
        r = runs[name]["results"]
        lane, fifo = r["lane"], r["token-fifo"]
        out += [
            (
                f"{name}: `lane` spends >= 97% of the ceiling",
                f"{100 * lane.budget_used:.1f}%",
                lane.budget_used >= 0.97,
            ),
            (f"{name}: `lane` never past the ceiling", f"over by {lane.over_ceiling:,}", lane.over_ceiling == 0),
            (
                f"{name}: `lane` finishes >= `token-fifo`'s jobs",
                f"{lane.done:,} vs {fifo.done:,}",
                lane.done >= fifo.done,
            ),
        ]
    for name in ("ceiling-azure-learned", "ceiling-mooncake-learned"):
        r = runs[name]["results"]
        lane, fifo = r["lane"], r["token-fifo"]
        ceiling = runs[name]["cfg"].ceiling
        est = lane.estimator
        out += [
            (
                f"{name}: `learned` drift 1.00 +- 0.05 after 200 settled",
                f"{est['drift']:.3f} ({est['jobs']:,} jobs)",
                abs(est["drift"] - 1) <= 0.05,
            ),
            (
                f"{name}: `lane` settles <= 0.5% past the ceiling, uses >= 95% of it",
                f"over by {lane.over_ceiling:,} ({100 * lane.over_ceiling / ceiling:.4f}%), used {100 * lane.budget_used:.2f}%",
                lane.over_ceiling <= 0.005 * ceiling and lane.budget_used >= 0.95,
            ),
            (
                f"{name}: `lane` never past the ceiling",
                f"over by {lane.over_ceiling:,} (`token-fifo` on the same estimates: {fifo.over_ceiling:,})",
                lane.over_ceiling == 0,
            ),
        ]
    r = runs["chained-budget"]["results"]
    lane, fifo = r["lane"], r["token-fifo"]
    stranded = lane.stranded_tokens / lane.spent if lane.spent else 0.0
    out += [
        (
            "chained-budget: `lane` uses >= 95% of the budget",
            f"{100 * lane.budget_used:.1f}%",
            lane.budget_used >= 0.95,
        ),
        ("chained-budget: `lane` strands <= 1% of spent tokens", f"{100 * stranded:.2f}%", stranded <= 0.01),
        (
            "chained-budget: `lane` finishes >= `token-fifo`'s runs",
            f"{lane.runs_finished:,} vs {fifo.runs_finished:,}",
            lane.runs_finished >= fifo.runs_finished,
        ),
        ("chained-budget: `lane` 0 over the ceiling", f"over by {lane.over_ceiling:,}", lane.over_ceiling == 0),
    ]
    for name in ("rate-azure", "rate-mooncake"):
        r = runs[name]["results"]
        lane, fifo = r["lane"], r["token-fifo"]
        p50, p99 = _ratio(lane.wait_p50, fifo.wait_p50), _ratio(lane.wait_p99, fifo.wait_p99)
        fair = lane.over_burst == 0  # waits bought by breaking the window are no win
        why = "" if fair else "; not comparable: `lane` broke the window"
        out += [
            (f"{name}: `lane` over_burst 0", f"{lane.over_burst:,} rate tokens", fair),
            (
                f"{name}: `lane` p50 wait <= 0.5x `token-fifo`'s",
                f"{sim_report.fmt_seconds(lane.wait_p50)} vs {sim_report.fmt_seconds(fifo.wait_p50)} ({p50:.2f}x{why})",
                fair and p50 <= 0.5,
            ),
            (
                f"{name}: `lane` p99 wait <= 1.3x `token-fifo`'s",
                f"{sim_report.fmt_seconds(lane.wait_p99)} vs {sim_report.fmt_seconds(fifo.wait_p99)} ({p99:.2f}x{why})",
                fair and p99 <= 1.3,
            ),
        ]
    for name in ("worker-azure", "worker-mooncake"):
        r = runs[name]["results"]
        best = max((x for p, x in r.items() if p != "lane"), key=lambda x: x.busy_pct)
        lane = r["lane"]
        out.append(
            (
                f"{name}: `lane` as busy as the best baseline",
                f"{lane.busy_pct:.1f}% vs {best.busy_pct:.1f}% (`{best.policy}`)",
                lane.busy_pct >= best.busy_pct - 0.05,
            )
        )
    big = runs["chained-budget"]
    lane, fifo = big["results"]["lane"], big["results"]["token-fifo"]
    out.append(
        (
            "simulator: the `lane` row >= 50k jobs/s",
            f"{lane.jobs_per_s:,.0f} jobs/s ({lane.jobs:,} jobs, chained-budget; `token-fifo` "
            f"{fifo.jobs_per_s:,.0f}, lane {_ratio(lane.jobs_per_s, fifo.jobs_per_s):.2f}x)",
            lane.jobs_per_s >= 50_000,
        )
    )
    return out


def load() -> str:
    try:
        return "load average " + ", ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "load average unknown"


READING = """
Reading the figures (written for the run of 2026-11-30, after issue 11's drift allowance landed;
checked again after its cap):

- **The drift allowance's cap** (found by an outside review): what the allowance keeps free is now
  `min(allowance, 5% of the ceiling, ceiling - est)`, so one outlier settlement can no longer close a
  lane for good. It changes no figure here but jobs/s (the allowances these runs learn are far under
  5% of the ceiling: ~27k kept free on Mooncake, 0.04%): every other figure is the one of the run
  before the cap, the never-past-the-ceiling targets included (ceiling-mooncake, ceiling-azure-learned,
  chained-budget: over by 0). Where it binds, drift worth more than 5% of the ceiling in flight at
  once settles past the ceiling.

- **ceiling-azure / ceiling-mooncake**: `lane` spends 100.0% of the ceiling and finishes more calls
  than `token-fifo` on both traces (Azure 4,360 to 4,342, Mooncake 5,667 to 5,657; before issue 11:
  80.0%, ~20% fewer calls, because a single call counted as starting a run and stopped at
  `start_fraction` 0.8), and now never settles past it. Before the **drift allowance** it settled
  6,952 tokens past the ceiling on Mooncake: outputs average 343 tokens against the 256 the estimate
  allows, and `lane` filled the ceiling to the last estimated token. Now admission allows for the drift
  it has seen: at every refit of the finishing reserve the lane learns, from its latest 1,000
  settlements, `drift` = sum(actual) / sum(est) when above 1, and the overruns past that
  drift-corrected size; each admission keeps free the drift-corrected size of what is in flight and
  of the job, the 90th percentile of those overruns per job in flight, and the largest one once
  (`lane_plugin/policy/drift.py`; `lane.drift`, `drift_spread`, `drift_overrun`, migration 0009). On
  Mooncake at the end: drift 1.0079, spread 302, overrun 1,683, so with 64 calls of ~12k in flight
  about 1,683 + 64 x 302 + 0.79% of 790k = ~27k tokens (0.04% of the ceiling) are kept free; on Azure
  the estimate covers the mean output (drift 1.0, spread 0) and only the overrun (684) is kept free.
- **ceiling-azure-learned / ceiling-mooncake-learned** (issue 12): the same replays with every call
  re-estimated at arrival by `learned` (its input + the mean output of the calls settled so far: no
  padding, drift 1.007 and 1.003) and admission keeping 2 sigma of the spread in flight free
  (`headroom_sigmas`, from each job's `est_var`). Both now settle under the ceiling with 99.99% and
  100.0% used. On Azure the headroom alone went 335 tokens past (`token-fifo` on the same estimates:
  335): the calls in flight at the last admission included one 1,899-token answer (mean 28, sd 60),
  far past any k-sigma headroom, and calls in flight are the long ones (service time follows output
  length). The drift allowance keeps the largest overrun seen free once (912 at the end) and the
  90th percentile per job in flight (24), on top of the headroom: 0 past.
- **chained-budget**: with stages submitted as the previous one settles, `lane` uses 100% of the week's
  budget, strands 0.72% of what it spends (0.83% before the drift allowance) and finishes ~18% more
  runs than `token-fifo` (22,661 to 19,195), which strands ~16% (it starts runs the deadline then cuts
  off). The size classes (below) do not apply to a stage of a run already under way: placed
  `max_wait_seconds` back like any big job, later stages met the 6 h deadline and the week stranded
  1.24% (0.74% before the classes). Finishing stages admitted on their estimate settle 1.3x bigger
  (this generator's drift): before the drift allowance the week settled 16,396 tokens past the
  ceiling (22,902 before the classes), now 0. A drift-corrected size with the largest overrun once
  (drift learned 1.28-1.31x, overrun 2-7k) left one day 472 past (noise 0.2 on 8 jobs in flight);
  the 90th percentile per job in flight (~200) covers it.
- **rate-azure / rate-mooncake**: every policy, `lane` included, stays inside the sliding window
  (over burst 0; before issue 11's changes `lane` admitted 25M and 94M rate tokens past it). The one
  continuous priority alone waited as long as `token-fifo` (1.00x and 0.92x at p50): it weighs a token
  of estimate at `max_wait_seconds / min(ceiling, burst)` = 600 s / 600k = 1 ms here, so a job 5,000
  tokens smaller went 5 s earlier in a queue minutes long. Now a lane learns two **size classes**
  (`benchmarks/bench_lean.py`'s `learned60`, shipped): at every refit of the finishing reserve it sets
  its boundary to the 60th percentile of its last 500 estimates (stored on the lane row,
  `lane.size_boundary`), and a job above it that does not finish a run already under way is placed
  `max_wait_seconds` later. Both targets are met on
  both traces (the table above; `bench_lean.py` printed the same 0.48x / 1.23x and 0.08x / 1.12x),
  and the wait bound holds: no job arriving more than `max_wait_seconds` after another is ever ahead
  of it (the cost: the top 10% by estimate wait longer, Azure p50 12.5 min against 6.9 min). Of the
  leans `bench_lean.py` tried, one scaled by the lane's settings instead of its traffic (linear up to
  `min(ceiling, burst) / 64` or `/ 128`) misses one trace either way (Azure p50 >= 0.75x, Mooncake p99
  >= 1.5x).
- **worker-azure / worker-mooncake**: when the worker binds, every policy keeps it equally busy.
- **simulator speed**: the `lane` row is still short of 50k jobs/s. Admission reads the two ranges'
  head lazily, in place, in admission order (sorted lists: what it leaves is not popped and pushed
  back), and `policy.admit` stops at the candidate that closes the lane with its reason known; a tick
  that leases and parks nothing skips the bookkeeping; a lane with a period skips admission while every
  waiting job is bigger than what spend leaves; the finishing reserve is refit incrementally, moved by
  stage rather than run by run; a lease's expiry enters the event heap only if the worker did not start
  the job at once; the cyclic GC is paused while `simulate` runs. tests/sim/test_fast_path.py checks,
  tick by tick, the same admissions, parks and expiries as the old path; every figure and event log of
  all four policies is unchanged on chained `--quick`, ceiling-azure, ceiling-mooncake-learned,
  rate-azure, worker-azure and `bench_simulate.py`'s budget-bound week. In CPU seconds
  (`benchmarks/bench_sim_speed.py --root` on main and on
  this change, alternating, two runs each, load average 6.5-7.4 on 2 cores): chained week `lane`
  18.4k/18.7k -> 23.9k/24.1k jobs/s (0.20x -> 0.26x `token-fifo`), rate-azure 21.5k/22.3k ->
  28.7k/29.4k, rate-mooncake 22.4k/22.8k -> 29.5k/31.0k (there `token-fifo` sped up too, ~96k -> ~110k,
  so the ratio moved less: 0.22x -> 0.26x): about 1.3x. Where the `lane`
  run's time goes now (pyinstrument, chained week): `admit` 31% (reading the head and building
  candidates 14%, its own loop 11%), the refit 9%, lapsing reserves 5%, recording admissions 4%, the
  rest of the tick 10%, the engine (leases, settlements, the worker, the deadline, the event heap)
  about 30%. One `admit` call per lease (73.5k calls for 68.5k leases) is the floor: the row costs
  about 42 us of CPU per job, 50k jobs/s allows 20, and the engine's own share is about 12 of them, so
  the whole tick (snapshot, head, decision, reserve bookkeeping) would have to fit in under 10 us,
  where building one frozen dataclass (`LaneSnapshot`, `Decision`) alone costs 2-3.5 us: out of reach
  in pure Python without changing the policy's data types or compiling it. The row's
  jobs/s above is wall time on a loaded machine.
  Issue 11's drift allowance then costs the chained week about a third of that: `lane` 25.2k/26.3k ->
  18.2k/17.2k jobs/cpu-s (0.26x -> 0.18x `token-fifo`; `bench_sim_speed.py --root`, main and this
  change alternating, load average 2.5-4.5). Once a day's ceiling is near, the lane keeps the
  allowance (a few thousand tokens) free instead of filling it, so for the rest of the day small
  finishing stages still trickle in while each tick reads a head of jobs that cannot fit before the
  reset (`admit` writes no reason for those once the head's is known, and a lane with a period skips
  the tick while the smallest waiting estimate with its allowance exceeds what spend leaves).
  Since then part of that is back. Counted on the chained 2 days (`--quick`), a third of the `lane` ticks
  leased nothing yet read the whole bounded head (22-31 candidates each) to learn so, and each refit's
  `fit_drift` walked 1,000 settlements in Python (0.7 ms, about a fifth of the run). Now the queue keeps
  the smallest estimate waiting per kind (`sim/lanequeue.py`, `LaneQueue.nothing_fits`: the finishing
  jobs, and the other range per stage; `est` plus its capped allowance grows with `est`, so when the
  smallest of a kind fails rules 3 and 4 every job of it does) and such a tick reads no head; the fit
  is vectorised (numpy; Python integers past int64). Every figure above but jobs/s is the one of the
  run before, on every scenario, and tests/sim/test_fast_path.py still shows every admission identical
  to the reference. `bench_sim_speed.py --root` (4bad429 and this change alternating, load 2.2-2.6):
  chained week `lane` 18.3k/16.9k -> 19.9k/18.5k jobs/cpu-s (0.15x -> 0.17x `token-fifo`), about 1.09x;
  the rate scenarios, where the check never fires, are unchanged within noise (its cheap question is
  asked first). The row's wall figure was 15.1k, 15.4k and 25.5k in three runs this day at load 2-3 (6.1k at load 3.4-5.4 before).
  What remains is one `admit` call per lease and the engine, as measured above: 50k jobs/s is still out of
  reach without compiling the policy. A plain Cython build of the same modules (policy, rules, drift
  and the simulator's engine, policies and reserve) measured 1.43x on the chained 2 days, not the 2.5x
  needed, and a compiled module shadowing its source in an editable install runs stale code after an
  edit; I did not ship it.
  How far pure Python can go is now measured: `benchmarks/bench_sim_speed.py --floor` replays the
  `lane` run's 97,195 tick decisions under a policy that only reads them back (no decision, no lane
  bookkeeping). On the chained week (2026-11-30, load average 2.1) `lane` ran 17,762 jobs/cpu-s (4.45
  cpu-s for 79,126 jobs) and the engine alone 98,561 (0.80 cpu-s): the policy costs 3.65 cpu-s, 37.6 us
  per tick. 50k jobs/s (1.58 s) leaves it 0.78 s, 8.0 us per tick, where one `admit` call alone costs
  ~20 us. The target needs the policy about 4.7x cheaper, not tuned: compiled, or a second, specialised
  copy of the admission rules for the simulator, which would stop it running the ledger's own `policy.admit`.
  Compiled with mypyc (mypy 2.4.1, CPython 3.11, gcc -O3; mypy needs a few dozen lines of annotations
  for it: rules' `Any` aliases, the engine's optional settings, ...), the chained week does not reach it
  either. `bench_sim_speed.py --floor`, pure Python and four builds alternating, two rounds (2026-11-30,
  load average 1.8-4.3): pure 19.1k/17.9k jobs/cpu-s; the policy modules compiled (policy, rules, drift,
  reserve, sizeclass) 22.7k/20.7k; with the simulator's policies, lanequeue, runs, window and meter
  27.0k/26.4k; with its engine 27.2k/26.8k (the replay floor 149k/147k); with config and traffic too
  28.8k/29.4k, 2.7 cpu-s for the 1.58 that 50k jobs/s allows: about 1.6x where 2.7x is needed, so it
  is not shipped (sim/chains.py hits an internal mypyc error; the rest of the package is off the hot
  path). What stays slow compiled: the frozen dataclasses' `__init__` is the one `dataclasses` writes,
  run by the interpreter (mypyc compiles their methods, not their construction): `LaneSnapshot` 1.7 us
  and `Decision` 0.9 us per tick, about 0.3 cpu-s; and the `lane` run's `Sim` is freed by the cyclic
  collector once `simulate` turns it back on (the engine, its `LaneQueue` and its `RunBook` refer to each
  other; the `--floor` replay runs no `LaneQueue`, so its timing has no such pass): 0.3-0.5 cpu-s of the
  row in either build (pure 3.52/3.55 -> 3.26/3.28 cpu-s with the cycle broken by hand after the run,
  compiled 2.43/2.74 -> 2.04/1.97 with the collector off throughout; load 4.3-6.2). Both removed,
  the compiled row would be about 1.7 cpu-s, 47k. (The cycle is now cut when a run ends, pure Python: `bench_sim_speed.py --floor` printed lane 22,688 and 22,516 jobs/cpu-s, 3.49 and 3.51 cpu-s, at load 4.2, where it printed 19,710, 4.01 cpu-s, at load 1.0 before.) Compiled, the test suite does not run as it is: 27
  tests of tests/sim monkeypatch functions and methods (`admit`, `fit_drift_arrays`, `RunBook.refit`,
  `LaneQueue.push`, ...) that compiled callers no longer look up, 3 read a dataclass's `__dict__`
  (compiled instances have none), and compiled `fit_drift` rounds its `int / int` differently past 2**53
  (hypothesis: `[(8, 2_238_209_164_191_571)]` fits drift 279776145523946.4, not ...946.38). Every
  `bench_targets.py --quick` scenario's figures and event log, all four policies, were the same compiled
  and pure.
  Where that leaves the target (2026-11-30, on a machine slower than the one above: the engine's replay
  floor 90k jobs/cpu-s where it was 134k): `bench_sim_speed.py --floor` printed `lane` 14,361 jobs/cpu-s
  and the engine replaying its 97,195 decisions 90,065 (0.88 cpu-s for 79,126 jobs), so 50k jobs/s leaves
  the policy 0.70 cpu-s, 7 us per tick, where it costs 48 us. Compiled, it gains 1.6x (above). The one
  way left is a second implementation of the admission rules for the simulator alone, checked against
  `policy.admit` tick by tick; it would end what makes the simulator worth trusting, that `lane simulate`
  runs the ledger's own code. The target is reported blocked on that choice (raise it with the
  maintainers, or restate it as a ratio to `token-fifo` in the same run); the other 24 hold.
"""


def markdown(runs: dict[str, dict], checks: list, quick: bool, machine: str) -> str:
    met = sum(ok for _, _, ok in checks)
    out = [
        "## Issue 11 targets on real traces",
        "",
        f"Generated by `python benchmarks/bench_targets.py{' --quick' if quick else ''}` on {machine} "
        f"({load()} when it finished: other work on the machine slows the jobs/s figures).",
        "Every policy runs under the same lease cap and the same **sliding** burst window (the engine's, counting",
        "`rate_cost`); `lane` runs the ledger's own `policy.admit` and finishing-reserve bookkeeping on it;",
        "`over burst` is what a provider counting like OpenAI would have refused. Real traces:",
        "Azure LLM inference trace, code, 2023-11-16 (8,819 calls, one hour; Azure Public Dataset, CC-BY 4.0) and",
        "Mooncake conversation trace (12,031 calls, one hour; FAST'25, Apache-2.0), read with",
        "est = input + 256, rate_cost = input + 2048 (max_tokens), service = 0.5 s + 0.02 s per output token.",
        "The clock runs until every queue drains (or can never drain: `stalled`); runs are chained.",
        "",
        f"**{met} of {len(checks)} targets met today.**",
        "",
        "| target | measured | |",
        "|---|---|---|",
    ]
    out += [f"| {t} | {m} | {'met' if ok else '**missed**'} |" for t, m, ok in checks]
    out += ["", READING.strip(), ""]
    for name, r in runs.items():
        results = list(r["results"].values())
        out += [f"### {name}", "", "```", command(name, r["trace"], r["cfg"], quick), "```", ""]
        out += sim_report.markdown_table(results)
        out += ["", f"Simulated in {r['wall']:.2f} s.", ""]
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="A 2-day chained scenario instead of a week.")
    ap.add_argument("--no-write", action="store_true", help="Print only; do not write docs/performance_targets.md.")
    ap.add_argument(
        "--tenants",
        metavar="NAME:WEIGHT:SHARE,...",
        help="Share every lane between these tenants (by hashing each request's id); implies --no-write.",
    )
    ap.add_argument(
        "--overtake-beta",
        metavar="B|off",
        help="The overtaking budget's beta (default: lane_plugin.policy.overtake.OVERTAKE_BETA), or off; "
        "implies --no-write.",
    )
    ap.add_argument(
        "--overtake-slack",
        metavar="C|off",
        help="Rule 12's quantile form (lane_plugin.policy.slack): the lane's p99 of tokens ahead within C x "
        "token-fifo's; implies --no-write.",
    )
    args = ap.parse_args()
    if args.overtake_slack is not None:
        OVERTAKE[0] = {"overtake_slack": None if args.overtake_slack == "off" else float(args.overtake_slack)}
        args.no_write = True
    if args.overtake_beta is not None:
        beta = None if args.overtake_beta == "off" else float(args.overtake_beta)
        OVERTAKE[0] = {"overtake_beta": beta, "overtake_slack": None, "overtake_exact": False}
        args.no_write = True
    if args.tenants:
        TENANTS[:] = parse_tenants(args.tenants)
        args.no_write = True
    missing = [p for p in (AZURE, MOONCAKE) if not p.exists()]
    if missing:
        sys.exit(f"bench_targets: missing trace(s) {', '.join(map(str, missing))} (set LANE_TRACES to their folder)")
    machine = sim_report.machine()
    print(f"machine: {machine}")
    runs = {name: run(name, args.quick) for name in SCENARIOS}
    checks = targets(runs)
    print("\n## targets")
    width = max(len(t) for t, _, _ in checks)
    for t, m, ok in checks:
        print(f"{'met   ' if ok else 'MISSED'} {t:<{width}}  {m}")
    print(f"{sum(ok for _, _, ok in checks)} of {len(checks)} targets met")
    if not args.no_write:
        DOC.write_text(markdown(runs, checks, args.quick, machine).rstrip() + "\n")
        print(f"\nwrote {DOC.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
