"""A provider benchmark with a real client: one workload through the openai SDK three ways, against OpenAI's limits.

    python benchmarks/bench_provider.py --quick        # 60 calls, an 8 s window: under about 2 minutes
    python benchmarks/bench_provider.py                # 300 calls, OpenAI's 60 s window: about 15 minutes
    python benchmarks/bench_provider.py --calls 120 --tpm 60000 --window 20 --ways AC --json
    python benchmarks/bench_provider.py --limits       # issue 24's variants (provider_limits.py): about 6 minutes

A local OpenAI-compatible emulator (``lane_plugin.testing.ProviderEmulator``)
counts TPM as OpenAI does: a sliding window charged ``prompt + max_tokens`` at
request time, plus RPM; over the limit it answers 429 with ``retry-after`` and
``x-ratelimit-*``. Output lengths are drawn from a real trace (seeded, by a hash
of each request, so the three ways meet the same outputs) and latency is
``base + per-token x output``. The workload: N chat calls whose prompt lengths
are the trace's input lengths (a seeded sample), each with ``max_tokens``.

Each way is a Prefect flow on the ephemeral server (a fresh PREFECT_HOME) with a
thread pool task runner, submitting every call at once; the emulator is reset
between ways:

(A)  plain ``@task``; the openai SDK's own retries (it honours ``retry-after``);
(B)  plain ``@task`` calling ``prefect.concurrency.sync.rate_limit(name,
     occupy=prompt + max_tokens)`` on a global concurrency limit with slot decay
     (a leaky bucket), then the same SDK call;
(C)  ``@lane_task`` on a fresh SQLite ledger, lane ``burst_tokens`` = TPM and
     ``window_seconds`` = the emulator's window, ``estimate`` = prompt + max_tokens
     (and ``rate_cost`` = prompt + max_tokens when this lane_task accepts it).

The rate bound is the least time the provider allows the whole workload:
total rate tokens / TPM x window. With a shorter window than 60 s the TPM is
scaled down with it, which keeps the bound in windows the same. Beside it the
report prints what an ideal client needs (:func:`ideal_wall`): no overhead, each
call sent the instant the sliding window has room for it, at most ``--workers``
in flight, each taking the emulator's latency for its output. The first window
is free, but calls do not pack a window exactly, so the bound is not a window
too generous: the ideal needs about the bound plus the last call.
"""

from __future__ import annotations

import argparse
import inspect
import json
import math
import os
import platform
import random
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
LIMIT = "bench-provider-tpm"
WAYS = {
    "A": "(A) @task + SDK retries",
    "B": "(B) @task + Prefect rate_limit",
    "C": "(C) @lane_task",
}
PREFECT_CAVEAT = """\
Prefect's global concurrency limit is a leaky bucket (slots decay at slot_decay_per_second), not a
sliding window: whatever fits its capacity enters at once, so one span of W seconds can take
capacity + W x decay. To obey TPM per sliding span it needs capacity + W x decay <= TPM; `--gcl safe`
sets capacity = the largest call and decay = (TPM - capacity) / W (no 429 possible, at
(TPM - capacity)/TPM of the provider's rate); `--gcl full` sets capacity = TPM, decay = TPM / W
(the provider's rate, but up to 2 x TPM in one span). Waiters poll with Retry-After, no FIFO."""


def workload(calls: int, trace: str, max_tokens: int, seed: int) -> list[tuple[int, int, int]]:
    """``(index, prompt_tokens, max_tokens)`` per call: prompt lengths sampled from the trace's inputs."""
    from lane_plugin.testing import load_trace

    inputs = [i for i, _ in load_trace(trace) if i > 0]
    rng = random.Random(seed)
    return [(k, rng.choice(inputs), max_tokens) for k in range(calls)]


def ideal_wall(args, work: list[tuple[int, int, int]]) -> float:
    """The wall time of an ideal client on this workload (the module docstring): the best of three orders."""
    from lane_plugin.policy.window import window_expiry
    from lane_plugin.testing import load_trace
    from lane_plugin.testing.limits import draw_length

    outputs = [o for _, o in load_trace(args.trace)]
    calls = []
    for i, p, m in work:
        out = min(draw_length(outputs, args.seed, {"model": "emu-1", "messages": prompt(i, p), "max_tokens": m}), m)
        calls.append((p + m, args.latency_base + args.latency_per_token * out))

    def greedy(waiting: list[tuple[int, float]]) -> float:
        t, window, busy, end = 0.0, [], [], 0.0
        while waiting:
            window = [(a, c) for a, c in window if a > t - args.window]
            busy = [d for d in busy if d > t]
            used = sum(c for _, c in window)
            k = next((k for k, (c, _) in enumerate(waiting) if used + c <= args.tpm), None)
            if k is not None and len(busy) < args.workers:
                c, s = waiting.pop(k)
                window.append((t, c))
                busy.append(t + s)
                end = max(end, t + s)
                continue
            t = min([window_expiry(a, args.window) for a, _ in window] + busy)  # room or a worker frees
        return end

    return min(greedy(sorted(calls, key=key)) for key in (lambda x: 0, lambda x: x[0], lambda x: -x[0]))


def prompt(i: int, tokens: int) -> list[dict]:
    """One user message of exactly ``tokens`` prompt tokens, unique per call."""
    text = f"call {i}: " + "word" * tokens
    return [{"role": "user", "content": text[: tokens * 4]}]


def build(args, url: str, base_url: str):
    """The three task variants (A, B, C) and the mode line of (C)."""
    from openai import OpenAI
    from prefect import task
    from prefect.concurrency.sync import rate_limit

    from lane_plugin import lane_task

    client = OpenAI(base_url=base_url, api_key="bench", max_retries=args.sdk_retries, timeout=120)

    def chat(i: int, prompt_tokens: int, max_tokens: int):
        return client.chat.completions.create(model="emu-1", messages=prompt(i, prompt_tokens), max_tokens=max_tokens)

    @task(name="call-plain", task_run_name="call-{i}")
    def plain(i: int, prompt_tokens: int, max_tokens: int):
        return chat(i, prompt_tokens, max_tokens)

    @task(name="call-rate-limit", task_run_name="call-{i}")
    def limited(i: int, prompt_tokens: int, max_tokens: int):
        rate_limit(LIMIT, occupy=prompt_tokens + max_tokens, strict=True)
        return chat(i, prompt_tokens, max_tokens)

    def cost(i: int, prompt_tokens: int, max_tokens: int) -> int:
        return prompt_tokens + max_tokens

    options = {}
    if "rate_cost" in inspect.signature(lane_task).parameters:
        options["rate_cost"] = cost
        mode = "rate_cost = prompt + max_tokens (lane_task accepts rate_cost)"
    else:
        mode = "no rate_cost parameter in this lane_task: the burst window counts estimate = prompt + max_tokens"
    gated = lane_task(stage="chat", estimate=cost, lane="bench", ledger=url, task_run_name="call-{i}", **options)(chat)
    return {"A": plain, "B": limited, "C": gated}, mode


def run_way(task_fn, work: list[tuple[int, int, int]], workers: int, key: str) -> dict:
    """One flow submitting every call to a thread pool; wall time from first submit to last result."""
    from prefect import flow
    from prefect.futures import wait
    from prefect.task_runners import ThreadPoolTaskRunner

    @flow(name=f"bench-provider-{key}", task_runner=ThreadPoolTaskRunner(max_workers=workers))
    def run() -> dict:
        t0 = time.perf_counter()
        futures = [task_fn.submit(*w) for w in work]
        wait(futures)
        wall = time.perf_counter() - t0
        failed = [f.state for f in futures if not f.state.is_completed()]
        return {"wall": wall, "failed": len(failed), "first_error": failed[0].message if failed else None}

    t0 = time.perf_counter()
    out = run()
    out["flow_wall"] = time.perf_counter() - t0
    return out


def setup(args, url: str, capacity: int, decay: float) -> None:
    """The (B) global concurrency limit and the (C) lane."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate

    from lane_plugin import Ledger

    with get_client(sync_client=True) as client:
        client.create_global_concurrency_limit(
            GlobalConcurrencyLimitCreate(name=LIMIT, limit=capacity, slot_decay_per_second=decay)
        )
    Ledger(url).set_lane(
        "bench",
        allowance=10**12,
        ceiling=10**12,
        start_fraction=1.0,
        burst_tokens=args.tpm,
        window_seconds=args.window,
        max_leased=10_000,
    )


def ledger_spent(url: str) -> int:
    from lane_plugin import Ledger

    return next(row["spent"] for row in Ledger(url).lanes() if row["lane"] == "bench")


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="60 calls, 8 s window, 24 s rate bound: under ~2 minutes")
    p.add_argument("--calls", type=int, help="chat calls in the workload (default 300; --quick 60)")
    p.add_argument("--window", type=float, help="the provider's sliding window in seconds (default 60; --quick 8)")
    p.add_argument("--tpm", type=int, help="rate tokens per window (default: derived from --bound)")
    p.add_argument("--bound", type=float, help="rate bound in seconds used to derive --tpm (default 240; --quick 24)")
    p.add_argument("--rpm", type=int, default=3_500, help="requests per window (default 3500)")
    p.add_argument("--max-tokens", type=int, default=256, help="max_tokens of every call (default 256)")
    p.add_argument("--trace", default="azure-code", help="azure-code, mooncake or a CSV path (default azure-code)")
    p.add_argument("--seed", type=int, default=0, help="seed of the prompt sample and of output draws")
    p.add_argument("--latency-base", type=float, default=0.2, help="seconds before the first token (default 0.2)")
    p.add_argument("--latency-per-token", type=float, default=0.01, help="seconds per output token (default 0.01)")
    p.add_argument("--workers", type=int, default=8, help="thread pool task runner workers (default 8)")
    p.add_argument("--sdk-retries", type=int, default=2, help="openai max_retries in every way (default 2, the SDK's)")
    p.add_argument("--gcl", choices=("safe", "full"), default="safe", help="how (B)'s limit is set (see below)")
    p.add_argument("--ways", default="ABC", help="which ways to run, e.g. AC (default ABC)")
    p.add_argument("--json", action="store_true", help="print one JSON document instead of the text report")
    p.add_argument("--verbose", action="store_true", help="show Prefect's logs (failed tasks log tracebacks)")
    p.add_argument(
        "--limits",
        action="store_true",
        help="run issue 24's variants instead (provider_limits.py): "
        "RPM-bound, requests + tokens, Anthropic style, a shared key; writes docs/performance_provider_limits.md",
    )
    p.add_argument("--only", help="with --limits: the variants to run, e.g. 4 or 14 (prints, writes no docs)")
    args = p.parse_args(argv)
    args.calls = args.calls or (60 if args.quick else 300)
    args.window = args.window or (8.0 if args.quick else 60.0)
    args.bound = args.bound or (24.0 if args.quick else 240.0)
    args.ways = "".join(k for k in "ABC" if k in args.ways.upper())
    if args.calls < 1 or args.window <= 0 or args.workers < 1 or not args.ways:
        p.error("--calls, --window, --workers must be positive and --ways name at least one of A, B, C")
    return args


def report(args, work, results: dict, mode: str, gcl: tuple[int, float], elapsed: float, command: str) -> str:
    """The text report: setup, one paragraph per way, the table."""
    import openai
    import prefect

    rate_total = sum(p + m for _, p, m in work)
    bound = rate_total / args.tpm * args.window
    scaled = (
        ""
        if args.window == 60
        else (
            f" (scaled: a window of {args.window:g} s, not 60 s, with a proportionally smaller TPM: "
            f"{args.tpm * 60 / args.window:,.0f} tokens per minute)"
        )
    )
    lines = [
        "## Provider benchmark: one workload, three ways",
        "",
        f"Command: `{command}`",
        f"Machine: {platform.node()}: {os.cpu_count()} cores, Python {platform.python_version()}, "
        f"{platform.platform()}; Prefect {prefect.__version__} ephemeral server, openai {openai.__version__}, "
        f"SQLite ledger; thread pool of {args.workers}; total {elapsed:.0f} s.",
        f"Provider: TPM {args.tpm:,} per {args.window:g} s sliding window{scaled}; RPM {args.rpm:,}; "
        f"outputs from {args.trace} (seed {args.seed}), latency {args.latency_base:g} s + "
        f"{args.latency_per_token * 1000:g} ms/token.",
        f"Workload: {len(work)} calls, prompts sampled from the trace's inputs "
        f"({sum(p for _, p, _ in work):,} prompt tokens), max_tokens {args.max_tokens}; "
        f"rate tokens {rate_total:,}: rate bound {bound:.1f} s; an ideal client (no overhead, each call sent the "
        f"instant the window has room, {args.workers} in flight) needs {ideal_wall(args, work):.1f} s.",
        f"(B) limit: --gcl {args.gcl}: capacity {gcl[0]:,}, slot_decay_per_second {gcl[1]:,.1f}.",
        f"(C) mode: {mode}.",
        "",
    ]
    header = (
        f"{'way':<32} {'429s':>5} {'failed':>7} {'wall s':>7} {'x bound':>7} {'peak/TPM':>8} "
        f"{'billed':>9} {'ledger':>9}"
    )
    rows = [header, "-" * len(header)]
    for key, r in results.items():
        ledger = f"{r['ledger_spent']:,}" if r.get("ledger_spent") is not None else "-"
        rows.append(
            f"{WAYS[key]:<32} {r['rejected_429']:>5} {r['failed']:>3}/{len(work):<3} {r['wall']:>7.1f} "
            f"{r['wall'] / bound:>7.2f} {r['max_window_tokens'] / args.tpm:>8.2f} "
            f"{r['billed_tokens']:>9,} {ledger:>9}"
        )
        if r["first_error"]:
            why = r["first_error"].removeprefix("Task run encountered an exception ").split(". Please")[0]
            lines.append(f"{WAYS[key]}: first failure: {why[:200]}")
    if "C" in results:
        c = results["C"]
        same = "=" if c["ledger_spent"] == c["billed_tokens"] else "!="
        lines.append(
            f"(C) ledger spent {c['ledger_spent']:,} {same} provider billed {c['billed_tokens']:,}; "
            f"ledger audit: {c['audit'] or 'sound'}."
        )
    if "B" in results:
        lines += ["", PREFECT_CAVEAT]
    return "\n".join(
        lines
        + [
            "",
            *rows,
            "",
            "429s: responses 429 the provider sent; failed: tasks not Completed; wall: first submit "
            "to last result; x bound: wall / rate bound; peak/TPM: most rate tokens charged in any "
            "sliding window / TPM (> 1.00 is impossible: the provider refuses it). x bound < 1 is possible: "
            "the first window is free, and failed calls send fewer tokens.",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    t_start = time.perf_counter()
    tmp = Path(tempfile.mkdtemp(prefix="bench-provider-"))
    os.environ["PREFECT_HOME"] = str(tmp / "prefect")  # a fresh ephemeral server
    os.environ["PREFECT_SERVER_ANALYTICS_ENABLED"] = "false"
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")  # a loaded machine starts slowly
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING" if args.verbose else "CRITICAL")
    url = f"sqlite:///{tmp / 'lane.db'}"
    if args.limits:
        sys.path.insert(0, str(ROOT / "benchmarks"))
        import provider_limits

        section = provider_limits.run(args, lambda name: f"sqlite:///{tmp / (name + '.db')}")
        if not args.only:
            (ROOT / "docs" / "performance_provider_limits.md").write_text(section)
        print(section)
        return 0
    work = workload(args.calls, args.trace, args.max_tokens, args.seed)
    biggest = max(p + m for _, p, m in work)
    if args.tpm is None:
        args.tpm = max(biggest, math.ceil(sum(p + m for _, p, m in work) * args.window / args.bound))
    if biggest > args.tpm:
        print(f"bench_provider: a call of {biggest} rate tokens can never fit TPM {args.tpm}", file=sys.stderr)
        return 2
    gcl = (biggest, (args.tpm - biggest) / args.window) if args.gcl == "safe" else (args.tpm, args.tpm / args.window)

    from lane_plugin import Ledger
    from lane_plugin.testing import ProviderEmulator

    results: dict[str, dict] = {}
    with ProviderEmulator(
        tpm=args.tpm,
        rpm=args.rpm,
        window_seconds=args.window,
        trace=args.trace,
        seed=args.seed,
        latency_base=args.latency_base,
        latency_per_token=args.latency_per_token,
    ) as emu:
        tasks, mode = build(args, url, emu.base_url)
        setup(args, url, *gcl)
        for key in args.ways:
            if not args.json:
                print(f"running {WAYS[key]} ...", file=sys.stderr, flush=True)
            emu.reset()
            out = run_way(tasks[key], work, args.workers, key)
            out.update(emu.stats())
            if key == "C":
                out["ledger_spent"], out["audit"] = ledger_spent(url), Ledger(url).audit()
            results[key] = out
    elapsed = time.perf_counter() - t_start
    command = "python benchmarks/bench_provider.py" + "".join(
        f" {a}" for a in (argv if argv is not None else sys.argv[1:])
    )
    if args.json:
        rate_total = sum(p + m for _, p, m in work)
        print(
            json.dumps(
                {
                    "command": command,
                    "args": vars(args),
                    "c_mode": mode,
                    "gcl": gcl,
                    "elapsed": elapsed,
                    "rate_tokens": rate_total,
                    "rate_bound": rate_total / args.tpm * args.window,
                    "ideal_wall": ideal_wall(args, work),
                    "ways": results,
                },
                default=str,
            )
        )
    else:
        print(report(args, work, results, mode, gcl, elapsed, command))
    return 0


if __name__ == "__main__":
    sys.exit(main())
