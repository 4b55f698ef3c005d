"""``lane simulate``: try a week of traffic in seconds before you trust a lane.

Registered in :mod:`lane_plugin.cli` as ``app.command("simulate")(simulate)``.
Imports neither Prefect nor pandas; matplotlib only for ``--plot``.
"""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path
from typing import Optional

import typer

from ..errors import TraceError
from .config import PERIODS, SimConfig
from .engine import simulate as run_policies
from .lanesettings import apply_limits, lane_settings, rule_12
from .policies import ONE_QUEUE, POLICIES
from .readers import MAX_TOKENS, OUTPUT_ALLOWANCE, load_trace
from .tenants import assign_by_hash, parse_tenants
from .traffic import MIXES, from_ledger, generate

# Flags that shape generated traffic, and flags that shape how a trace file is read.
GENERATOR_FLAGS = {
    "jobs": "--jobs",
    "mix": "--mix",
    "drift": "--drift",
    "noise": "--noise",
    "seed": "--seed",
    "stages": "--stages",
    "median": "--median",
    "days": "--days",
}
TRACE_FLAGS = {"output_allowance": "--output-allowance", "max_tokens": "--max-tokens"}


def _given(ctx: typer.Context | None, names: dict[str, str]) -> list[str]:
    """The flags among ``names`` the user set (on the command line or in the environment)."""
    if ctx is None:
        return []
    # By name: typer may bundle its own click, whose ParameterSource is another enum than click's.
    sources = {name: getattr(ctx.get_parameter_source(name), "name", "DEFAULT") for name in names}
    return [flag for name, flag in names.items() if sources[name] not in ("DEFAULT", "DEFAULT_MAP")]


def _check_sources(ctx: typer.Context | None, trace: Optional[Path], from_ledger_: bool) -> None:
    """Exit 2 when flags of one source of traffic come with another (nothing silently ignored)."""
    if trace is not None and from_ledger_:
        raise _fail("--trace and --from-ledger both given: choose one source of traffic")
    if trace is not None:
        gen = _given(ctx, GENERATOR_FLAGS)
        if gen:
            raise _fail(
                f"{', '.join(gen)} shape(s) generated traffic and cannot apply to --trace {trace}: drop "
                "them, or drop --trace to generate traffic"
            )
        return
    gen = _given(ctx, {k: v for k, v in GENERATOR_FLAGS.items() if k != "days"}) if from_ledger_ else []
    if gen:
        raise _fail(f"{', '.join(gen)} shape(s) generated traffic and cannot apply to --from-ledger: drop them")
    tflags = _given(ctx, TRACE_FLAGS)
    if tflags:
        raise _fail(f"{', '.join(tflags)} read(s) a trace of real calls and need(s) --trace FILE")


def _fail(msg: str) -> typer.Exit:
    from ..ledger.url import redact  # a ledger's message names its URL: never with a password

    typer.echo(f"lane simulate: error: {redact(msg)}", err=True)
    return typer.Exit(2)


def simulate(
    ctx: typer.Context,
    trace: Optional[Path] = typer.Option(
        None,
        "--trace",
        help="Trace CSV; its header tells the format: arrival_s, stage, est, actual [, run_key, rate_cost]; "
        "or arrival_s, input_tokens, output_tokens [, stage, run_key]; or Azure (TIMESTAMP, ContextTokens, "
        "GeneratedTokens); or Mooncake (timestamp_ms, input_length, output_length).",
        exists=True,
        dir_okay=False,
        show_default=False,
    ),
    output_allowance: int = typer.Option(
        OUTPUT_ALLOWANCE, help="Trace of real calls: est = input + this many output tokens."
    ),
    max_tokens: int = typer.Option(
        MAX_TOKENS, help="Trace of real calls: the client's max_tokens; rate_cost = input + it, output capped at it."
    ),
    jobs: int = typer.Option(
        10_000, "--jobs", help="Generator: number of jobs (used when neither --trace nor --from-ledger)."
    ),
    mix: str = typer.Option("lognormal", "--mix", help=f"Generator: estimate mix, one of {', '.join(MIXES)}."),
    drift: float = typer.Option(
        1.0, "--drift", help="Generator: actual/estimate ratio (1.3 = the estimator is 30% low)."
    ),
    noise: float = typer.Option(0.2, "--noise", help="Generator: sigma of the lognormal noise on each actual."),
    seed: int = typer.Option(0, "--seed", help="Generator: random seed."),
    days: float = typer.Option(
        7.0, "--days", help="Generator: days the traffic spans; --from-ledger: days of history."
    ),
    stages: int = typer.Option(3, "--stages", help="Generator: jobs per pipeline run (same run_key)."),
    median: float = typer.Option(1_000.0, "--median", help="Generator: median estimate in tokens."),
    tenants: Optional[str] = typer.Option(
        None,
        "--tenants",
        metavar="NAME:WEIGHT:SHARE,...",
        help="Tenants sharing the lane, e.g. backfill:1:0.9,interactive:4:0.1: the generator draws each run's "
        "by SHARE; a trace without a tenant column gets them by hashing each run key (else row number); "
        "WEIGHT is the tenant's weight. Adds today's order (lane-one-queue) as a baseline row and per-tenant "
        "figures.",
        show_default=False,
    ),
    from_ledger_: bool = typer.Option(
        False, "--from-ledger", help="Replay the settled jobs of the last --days days of the ledger at --db."
    ),
    db: Optional[str] = typer.Option(
        None,
        "--db",
        help="Ledger URL for --from-ledger/--lane (default: lane --db, $LANE_DATABASE_URL, lane.db).",
        show_default=False,
    ),
    lane: Optional[str] = typer.Option(
        None, "--lane", help="Start from this existing lane's settings (flags below override them).", show_default=False
    ),
    ceiling: Optional[int] = typer.Option(None, help="Never admit past this many tokens [8,000,000]."),
    allowance: Optional[int] = typer.Option(
        None, help="The provider's allowance, for the over-allowance column [10,000,000]."
    ),
    start_fraction: Optional[float] = typer.Option(
        None, help="Starting a run stops at this share of the ceiling [0.8]."
    ),
    limit: Optional[list[str]] = typer.Option(
        None,
        "--limit",
        metavar="UNIT=AMOUNT/WINDOW",
        help="A sliding-window limit as the provider states it, as lane lanes set takes it, repeatable: "
        "requests=500/60s, tokens=30000/60s (the burst window), input_tokens=..., output_tokens=8000/60s; "
        "UNIT=none drops one (of --lane's).",
    ),
    burst_tokens: Optional[int] = typer.Option(None, help="Tokens admitted per window [40,000]."),
    window_seconds: Optional[float] = typer.Option(None, help="Burst window length [1.0]."),
    max_leased: Optional[int] = typer.Option(None, help="Leases held at once [25]."),
    lease_seconds: Optional[float] = typer.Option(
        None, help="A lease the worker has not started by then expires [90]."
    ),
    max_wait_seconds: Optional[float] = typer.Option(None, help="Aging: a job waiting this long goes first [600]."),
    max_attempts: Optional[int] = typer.Option(None, help="Leases per job before it is parked [3]."),
    headroom_sigmas: Optional[float] = typer.Option(
        None,
        help="Keep this many standard deviations of the spread of what is in flight free [2.0]; "
        "the spread is known with --estimator.",
    ),
    estimator: Optional[str] = typer.Option(
        None,
        "--estimator",
        help="Re-estimate each job at submission with this estimator (learned), learning "
        "from the jobs of its stage settled so far; needs a trace with input tokens.",
        show_default=False,
    ),
    warmup: int = typer.Option(
        200, help="--estimator: its figures count jobs estimated after this many of their stage settled."
    ),
    period: Optional[str] = typer.Option(
        None, help=f"Budget reset: {', '.join(PERIODS)} (monthly = 30 days) [none].", show_default=False
    ),
    workers: int = typer.Option(1, help="Parallel slots of the slow worker."),
    service_base: float = typer.Option(1.0, help="Worker: seconds per job."),
    service_per_token: float = typer.Option(0.001, help="Worker: extra seconds per actual token (output unknown)."),
    service_per_output_token: float = typer.Option(
        0.02, help="Worker: extra seconds per output token (trace knows it)."
    ),
    chain: bool = typer.Option(
        True, "--chain/--no-chain", help="Submit stage k+1 of a run when stage k settles (else at its recorded time)."
    ),
    sleep_seconds: float = typer.Option(0.0, help="Cold drainer: the worker sleeps this long..."),
    sleep_every: float = typer.Option(0.0, help="...at the end of every this many seconds."),
    preflight: bool = typer.Option(
        False, "--preflight", help="The lane's preflight fails (lane stopped) while the worker sleeps."
    ),
    deadline: Optional[float] = typer.Option(None, help="Park a job still waiting this many seconds after arrival."),
    count_slots: Optional[int] = typer.Option(None, help="K of the count policy [max_leased]."),
    horizon: Optional[float] = typer.Option(None, help="Stop the clock here, in seconds (default: until drained)."),
    starve_after: float = typer.Option(3_600.0, help="A never-admitted, overtaken job waiting this long is starved."),
    overtake_beta: Optional[float] = typer.Option(
        None,
        "--overtake-beta",
        help="Rule 12's pointwise form instead of its slack (an exploration): younger jobs take at most this "
        "times the rate tokens a job found waiting ahead of it (0.25: within 1.25x of token-fifo's). Default: off.",
    ),
    overtake_slack: Optional[str] = typer.Option(
        None,
        "--overtake-slack",
        help="Rule 12: the lane's p99 of rate tokens ahead of a job within C times token-fifo's, or off "
        "(the order alone). Default: the --lane's, else off.",
        metavar="C|off",
    ),
    overtake_day: Optional[int] = typer.Option(
        None,
        "--overtake-day",
        help="With rule 12 on: 2, the lane's second day (its p99 backlog learned from a first replay of the same "
        "traffic, run as its learning day; the default); 1, its learning day (nobody held back); 0, a running "
        "estimate (an exploration). Given, a --lane's own p99 backlog is not read.",
    ),
    overtake_learned: Optional[int] = typer.Option(
        None,
        "--overtake-learned",
        help="With rule 12 on: the p99 of the rate tokens waiting at arrivals the lane learned before (as "
        "lane lanes set --overtake-q seeds it): every key reads it. Default: the --lane's, else per --overtake-day.",
    ),
    policies: str = typer.Option(
        ",".join(POLICIES),
        help=f"Comma-separated policies to compare (default: {', '.join(POLICIES)})",
        show_default=False,
    ),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of the table."),
    progress: Optional[bool] = typer.Option(
        None,
        "--progress/--no-progress",
        help="A progress bar on stderr (default: when stderr is a terminal).",
        show_default=False,
    ),
    plot: Optional[Path] = typer.Option(
        None,
        "--plot",
        help="Write a PNG: spent over time per policy vs the ceiling, and wait by job size.",
        dir_okay=False,
        show_default=False,
    ),
) -> None:
    """Replay traffic through the ledger's admission policy and three baselines, side by side.

    The lane row runs lane_plugin.policy.admit, the very code the ledger
    runs, on a simulated clock with a simulated slow worker (service time =
    base + per output token, or per actual token where output is unknown).
    Baselines, under the same lease cap and sliding burst window: count (K
    leases, FIFO, blind to the budget), token-fifo (stops at the first job
    past the ceiling) and smallest-first (the article's tick, budget bug
    kept). Traffic comes from --trace, --from-ledger, or the generator (--jobs
    --mix --drift --seed); stage k+1 of a run is submitted when stage k
    settles. The clock runs until the queue is drained unless --horizon.

    Example: lane simulate --jobs 100000 --mix lognormal --drift 1.3 --period daily --plot sim.png
    """
    names = [p.strip() for p in policies.split(",") if p.strip()]
    bad = [p for p in names if p not in POLICIES]
    if bad or not names:
        raise _fail(f"policies={policies!r}: expected a comma-separated subset of {', '.join(POLICIES)}")
    if period is not None and period not in PERIODS:
        raise _fail(f"period={period!r}: expected one of {', '.join(PERIODS)}")
    _check_sources(ctx, trace, from_ledger_)
    url = db or (ctx.parent.params.get("db") if ctx is not None and ctx.parent is not None else None)
    if lane is not None or from_ledger_:  # it reads a ledger: named first on stderr, as every command's is
        from ..cli_common import name_ledger

        try:
            url = name_ledger(url)
        except Exception as exc:  # noqa: BLE001 - a bad URL or an unreadable block ends the command with its message
            raise _fail(f"cannot open the ledger: {exc}") from None

    settings: dict = {}
    try:
        if lane is not None:
            settings.update(lane_settings(url, lane))
    except Exception as exc:  # noqa: BLE001 - any ledger error ends the command with its message
        raise _fail(f"lane={lane!r}: cannot read its settings: {exc}") from None
    flags = dict(
        ceiling=ceiling,
        allowance=allowance,
        start_fraction=start_fraction,
        burst_tokens=burst_tokens,
        window_seconds=window_seconds,
        max_leased=max_leased,
        lease_seconds=lease_seconds,
        max_wait_seconds=max_wait_seconds,
        max_attempts=max_attempts,
        headroom_sigmas=headroom_sigmas,
    )
    settings.update({k: v for k, v in flags.items() if v is not None})
    try:
        rule_12(settings, overtake_slack, overtake_beta, overtake_learned, overtake_day)
    except ValueError as exc:
        raise _fail(str(exc)) from None
    if period is not None:
        settings["period_seconds"] = PERIODS[period]
    try:
        apply_limits(settings, limit or [], {"--burst-tokens": burst_tokens, "--window-seconds": window_seconds})
    except ValueError as exc:
        raise _fail(str(exc)) from None
    if "ceiling" in settings and "allowance" not in settings:
        settings["allowance"] = max(settings["ceiling"], int(settings["ceiling"] / 0.8))
    try:
        tenant_spec = parse_tenants(tenants) if tenants is not None else None
        cfg = SimConfig(
            **settings,
            workers=workers,
            service_base=service_base,
            service_per_token=service_per_token,
            service_per_output_token=service_per_output_token,
            sleep_seconds=sleep_seconds,
            sleep_every=sleep_every,
            preflight=preflight,
            deadline=deadline,
            count_slots=count_slots,
            horizon=horizon,
            starve_after=starve_after,
            chain=chain,
            estimator=estimator,
            warmup=warmup,
        )
        if tenant_spec is not None:  # --tenants' weights, over those of the --lane's tenants
            cfg = replace(cfg, tenant_weights=tuple((n, w) for n, w, _ in tenant_spec))
        if trace is not None:
            tr = load_trace(trace, output_allowance=output_allowance, max_tokens=max_tokens)
        elif from_ledger_:
            tr = from_ledger(url, days)
        else:
            tr = generate(
                jobs,
                mix=mix,
                drift=drift,
                noise=noise,
                seed=seed,
                days=days,
                stages=stages,
                median=median,
                tenants=tenant_spec,
            )
        if tenant_spec is not None and all(t is None for t in tr.tenant):
            assigned: list[str | None] = list(
                assign_by_hash([rk or str(i) for i, rk in enumerate(tr.run_key)], tenant_spec)
            )
            tr.tenant = assigned
        if estimator is not None:
            from .estimating import OnlineEstimator

            OnlineEstimator(estimator, tr)  # refuses a trace without input tokens, before any simulation
    except (ValueError, TraceError) as exc:
        raise _fail(str(exc)) from None
    except Exception as exc:  # noqa: BLE001 - e.g. the ledger database cannot be read
        raise _fail(f"cannot read traffic: {exc}") from None

    if len(set(tr.tenant)) > 1 and "lane" in names and ONE_QUEUE not in names:
        names.insert(names.index("lane"), ONE_QUEUE)  # today's order, the baseline of the fair one
    from . import report as sim_report
    from .progress import ProgressBar

    bar = ProgressBar(names) if ProgressBar.wanted(progress) else None
    wall = time.perf_counter()
    try:
        results = run_policies(tr, cfg, names, progress=bar)
    finally:
        if bar is not None:
            bar.close()
    wall = time.perf_counter() - wall
    if as_json:
        typer.echo(json.dumps(sim_report.to_json(tr, cfg, results, wall), indent=2, default=str))
    else:
        sim_report.print_table(tr, cfg, results, wall)
    if plot is not None:
        sim_report.plot(tr, cfg, results, str(plot))
        if not as_json:
            typer.echo(f"wrote {plot}")
