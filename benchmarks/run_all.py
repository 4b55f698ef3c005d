"""Run every benchmark and regenerate the site's performance pages (docs/performance/) from what they print.

    python benchmarks/run_all.py              # full figures (takes a while: 1M-job queues)
    python benchmarks/run_all.py --quick      # smaller sizes, same tables
    python benchmarks/run_all.py --pages-only # run nothing: re-lay the pages from the stored sections

Each benchmark prints its figures; those that write a markdown section
(docs/performance_<name>.md, kept out of the site by mkdocs.yml) have it included
verbatim, the others have their printed output (docs/performance_<name>.txt)
included. Each benchmark gets a page (one over 380 lines is split at its ###
headings); every page names the command that made it, and the index page starts
with the machine it ran on. Ratios are measured within one run.
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"

# (title, script, full args, quick args, markdown section it writes or None, what it shows)
BENCHMARKS = [
    (
        "Tokens beat job counts: a simulated week",
        "bench_simulate.py",
        [],
        ["--jobs", "20000"],
        "performance_simulate.md",
        "`lane simulate` runs the ledger's own policy against `count` (slot limits), `token-fifo` and the "
        "article's `smallest-first` on heavy-tailed traffic with estimator drift 1.3, chained runs, every policy "
        "under the same lease cap and sliding burst window.",
    ),
    (
        "Issue 11 targets on real traces",
        "bench_targets.py",
        [],
        ["--quick"],
        "performance_targets.md",
        "the targets of issue 11 measured on the Azure and Mooncake traces and on chained generated runs: budget "
        "used, runs finished, tokens stranded, rate tokens past a sliding window, waits against a rate-respecting "
        "FIFO, worker busy, simulator speed; each printed met or missed.",
    ),
    (
        "Ledger throughput against plain SQL",
        "bench_ledger.py",
        [],
        ["--seconds", "2"],
        "performance_ledger.md",
        "admit+settle cycles/s through the Ledger against the same two transactions as bare SQL; "
        "targets: at least 40% of plain on SQLite, 60% on PostgreSQL; CLI under 0.3 s per call.",
    ),
    (
        "Tick latency as the queue grows",
        "bench_tick.py",
        [],
        ["--sizes", "1000,100000", "--ticks", "100"],
        "performance_tick.md",
        "admission reads the head of an index: p50 latency from 1k to 1M waiting stays within 2x.",
    ),
    (
        "Gated task overhead",
        "bench_gate.py",
        [],
        [],
        "performance_gate.md",
        "a flow of 200 trivial tasks as plain @task, as @lane_task (with and without its two tags), and "
        "gated by Prefect's own concurrency(occupy=): targets (b)/(a) <= 1.25 and (b) 5x faster than (c) "
        "per gated task.",
    ),
    (
        "Waiters: hand-off, wake-ups, one ticker per lane",
        "bench_waiters.py",
        [],
        ["--quick"],
        "performance_waiters.md",
        "N gated waiters in P processes on few slots, on SQLite and PostgreSQL, beside Prefect's concurrency(occupy=) "
        "on a real server: wall against the ideal, slot use, transactions per job, lane-lock wait, lane-lock hold, "
        "slot refill latency; issue 14's targets printed met or missed.",
    ),
    (
        "Provider benchmark: one openai-SDK workload three ways",
        "bench_provider.py",
        [],
        ["--quick"],
        None,
        "a local OpenAI-compatible emulator (sliding-window TPM like OpenAI, 429 with retry-after) and one workload "
        "through the openai SDK as plain @task with SDK retries, with Prefect's rate_limit, and as @lane_task: 429s, "
        "wall against the rate bound and an ideal client, provider-billed against ledger-spent tokens. Target "
        "(issue 11): @lane_task 0 x 429, wall <= 1.15x the rate bound, ledger spent = provider billed.",
    ),
    (
        "Provider limits: requests, tokens, input and output, a 429 heard by every worker",
        "bench_provider.py",
        ["--limits"],
        ["--limits"],
        "performance_provider_limits.md",
        "issue 24's variants through real SDKs over HTTP: RPM-bound (beside plain tasks with SDK retries), requests "
        "and tokens both binding, Anthropic style input and output tokens per window, a key shared with a client "
        "outside the lane with and without track_limits. Targets: 0 x 429 within 1.2x / 1.15x / 1.2x the binding "
        "bound; shared key <= 3 x 429 per 100 calls within 1.3x, and no request sent into a closed window.",
    ),
    (
        "Backfill and interactive: two tenants through real Prefect runs",
        "bench_tenants.py",
        ["--server-db", "postgres", "--overtake-q", "100000"],
        ["--quick", "--server-db", "postgres", "--overtake-q", "100000"],
        None,
        "issue 23's case: one process submits 2,000 jobs of tenant backfill at once, another a 5-job run of tenant "
        "interactive every 30 s, on one lane whose burst window binds, through a real Prefect server on PostgreSQL: "
        "the interactive runs' completion p99 against their time on the empty lane (target <= 2x), the backfill's "
        "tokens/s against its rate alone (target >= 0.95), one tenant (first come, first served) as the baseline, "
        "and where the interactive runs' time goes (Prefect, the ledger's wait, the bodies) from the ledger's rows. "
        "Rule 12 (on by default) on the lane's second day, Q seeded: the binding case, not its learning day.",
    ),
    (
        "Tick latency of a lane shared by many tenants",
        "bench_tenant_tick.py",
        [],
        ["--tenants", "1,10", "--waiting", "1000"],
        None,
        "1, 10 and 100 tenants with 4,000 jobs waiting, 25 admitted a tick, rule 12 off and binding, on SQLite and "
        "PostgreSQL, the job table never analysed (a new deployment's first minutes): tick p50 and p99 against one "
        "tenant with rule 12 off in the same run, and the epoch rows rule 12 keeps.",
    ),
    (
        "Parking 100,000 overdue jobs",
        "bench_park.py",
        [],
        ["--jobs", "20000"],
        None,
        "park_overdue is set-based: 100k overdue jobs in under 10 s, each parked exactly once, with two "
        "copies running at once.",
    ),
    (
        "Estimator calibration",
        "bench_calibration.py",
        [],
        [],
        None,
        "on the example pipeline (flows/pipeline.py's model and estimator) the biased critique stage shows drift > 1.5 "
        "under the plain estimator, 1.0 +- 0.15 under calibrated and 1.0 +- 0.05 under learned after 200 settled jobs, "
        "side by side in one report.",
    ),
    (
        "The example pipeline's biased stage through a ledger",
        "bench_pipeline_drift.py",
        [],
        ["--docs", "400"],
        None,
        "flows/pipeline.py's documents, model and prompts through a real ledger: the critique stage's drift under its "
        "TextLength estimator (> 1.5) and under learned (1.00 +- 0.05 after 200 settled jobs), with est_input and est_var "
        "recorded at intake and the state refitted in the ledger every 50 jobs.",
    ),
    (
        "Estimators on real traces",
        "bench_estimators.py",
        [],
        [],
        "performance_estimators.md",
        "learned, calibrated(input-only base) and a chars/4-style constant estimated online on the Azure code and "
        "Mooncake conversation traces: learned's drift is 1.00 +- 0.05 after 200 settled jobs; under-estimated share, "
        "overspend share, idle room and per-job ratio quantiles side by side.",
    ),
]


def machine() -> str:
    cpu = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return (
        f"{cpu or platform.processor()}, {os.cpu_count()} cores, {platform.system()} {platform.release()}, "
        f"Python {platform.python_version()}"
    )


def without_heading(text: str) -> str:
    """A benchmark's section or printed output as the page includes it: without its own leading ``## `` heading
    (the page gives each section its title already; inside an output block it would read as a second title).

    Example:
        >>> without_heading("## Provider benchmark\\n\\nCommand: `x`\\n")
        'Command: `x`'
    """
    text = text.strip()
    if text.startswith("## "):
        text = text.split("\n", 1)[1].strip() if "\n" in text else ""
    return text


SITE = DOCS / "performance"  # the site's performance pages, written from the sections above
PAGE_LINES = 380  # a page longer than this is split at its ### headings (the docs keep every page under 400)


def slug(script: str, section: str | None = None) -> str:
    """A benchmark's page name: ``bench_pipeline_drift.py`` -> ``pipeline-drift``; one that writes a section, the
    section's (``performance_provider_limits.md`` -> ``provider-limits``: one script may make two pages)."""
    if section:
        return Path(section).stem.removeprefix("performance_").replace("_", "-")
    return Path(script).stem.removeprefix("bench_").replace("_", "-")


def section_text(script: str, section: str | None, shown: str) -> str:
    """What a benchmark's page shows below its title: its markdown section, or its printed output in a block."""
    if section and (DOCS / section).exists():
        return without_heading((DOCS / section).read_text())
    out = DOCS / f"performance_{Path(script).stem.removeprefix('bench_')}.txt"
    text = without_heading(out.read_text()) if out.exists() else "(not run yet)"
    return "\n".join([f"Command: `{shown}`", "", "```", text, "```"])


def split_at_subheadings(text: str, limit: int = PAGE_LINES) -> list[str]:
    """``text`` in parts of at most ``limit`` lines where it can be: whole ``### `` subsections, in order.

    Example:
        >>> [p.count("###") for p in split_at_subheadings("intro\n### a\n1\n### b\n2", limit=3)]
        [1, 1]
    """
    lines, fenced, starts = text.splitlines(), False, [0]
    for n, line in enumerate(lines):
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and line.startswith("### ") and n:
            starts.append(n)
    blocks = [lines[a:b] for a, b in zip(starts, [*starts[1:], len(lines)])]
    parts: list[list[str]] = [blocks[0]]
    for block in blocks[1:]:
        if len(parts[-1]) + len(block) > limit:
            parts.append(block)
        else:
            parts[-1] = parts[-1] + block
    return ["\n".join(part).strip() for part in parts]


def render_pages(stamp: str, quick: bool = False) -> dict[str, str]:
    """The performance pages from the stored sections: ``{file name under docs/performance/: text}``.

    ``stamp`` is the index page's line saying which machine ran the benchmarks and when. A section longer than
    :data:`PAGE_LINES` is split at its ``###`` headings into ``NAME.md``, ``NAME-2.md``, ...
    """
    pages: dict[str, str] = {}
    rows = []
    for title, script, full, quick_args, section, shows in BENCHMARKS:
        shown = "python benchmarks/" + script + "".join(" " + a for a in (quick_args if quick else full))
        parts = split_at_subheadings(section_text(script, section, shown))
        page = slug(script, section)
        names = [f"{page}.md"] + [f"{page}-{n}.md" for n in range(2, len(parts) + 1)]
        for n, (name, part) in enumerate(zip(names, parts), 1):
            if len(parts) == 1:
                heading, lead = title, shows
            else:
                subs = [line[4:] for line in part.splitlines() if line.startswith("### ")]
                heading = f"{title} ({n} of {len(parts)})"
                lead = shows if n == 1 else f"Continued from [part {n - 1}]({names[n - 2]}): {', '.join(subs)}."
            more = f"\n\nContinued in [part {n + 1}]({names[n]})." if n < len(parts) else ""
            pages[name] = f"# {heading}\n\n{lead}\n\n{part}{more}\n"
        rows.append(f"| [{title}]({names[0]}) | {shows} |")
    pages["index.md"] = "\n".join(
        [
            "# Performance",
            "",
            stamp,
            "",
            "Each page names the command that made its figures; a benchmark run on its own (`--only`) says so on its",
            "page, with its own machine and load. Regenerate them all with `python benchmarks/run_all.py`.",
            "",
            "| benchmark | what it shows |",
            "|---|---|",
            *rows,
            "",
        ]
    )
    return pages


def stored_stamp() -> str | None:
    """The machine line of the index page written last, if there is one."""
    index = SITE / "index.md"
    if not index.exists():
        return None
    return next((line for line in index.read_text().splitlines() if line.startswith("Machine: ")), None)


def write_pages(pages: dict[str, str]) -> None:
    SITE.mkdir(exist_ok=True)
    for name, text in pages.items():
        (SITE / name).write_text(text)
    print(f"wrote {len(pages)} pages under {SITE}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="smaller sizes for a fast look")
    ap.add_argument("--only", help="comma-separated script names to run (others keep their last section)")
    ap.add_argument(
        "--pages-only",
        action="store_true",
        help="run nothing: rewrite docs/performance/ from the stored sections (after a benchmark was run on its own)",
    )
    args = ap.parse_args()
    if args.pages_only:
        stamp = stored_stamp()
        if stamp is None:
            sys.exit(f"no {SITE / 'index.md'} to take the machine line from: run the benchmarks first")
        write_pages(render_pages(stamp, quick=args.quick))
        return
    only = set(args.only.split(",")) if args.only else None
    env = {**os.environ, "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    env.setdefault(
        "LANE_BENCH_POSTGRES_URL", env.get("LANE_TEST_POSTGRES_URL", "postgresql+psycopg://root@127.0.0.1:5432/test")
    )
    stamp = (
        f"Machine: {machine()}. Generated {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} by "
        f"`python benchmarks/run_all.py{' --quick' if args.quick else ''}`. Absolute times are this "
        "machine's; comparisons are ratios measured in the same run."
    )
    failures = []
    for _title, script, full, quick, section, _shows in BENCHMARKS:
        path = ROOT / "benchmarks" / script
        if not path.exists():
            print(f"== {script}: missing, skipped")
            continue
        if only is not None and script not in only:
            continue
        cmd = [sys.executable, str(path), *(quick if args.quick else full)]
        shown = "python benchmarks/" + script + "".join(" " + a for a in (quick if args.quick else full))
        print(f"== {shown}", flush=True)
        t = time.perf_counter()
        p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
        print(p.stdout[-6000:], flush=True)
        if p.returncode != 0:
            print(p.stderr[-3000:], file=sys.stderr)
            failures.append(script)
            continue
        print(f"   ({time.perf_counter() - t:.0f} s)")
        if section is None:
            (DOCS / f"performance_{path.stem.removeprefix('bench_')}.txt").write_text(p.stdout)
    write_pages(render_pages(stamp if only is None else (stored_stamp() or stamp), quick=args.quick))
    if failures:
        sys.exit(f"failed: {', '.join(failures)} (their pages keep the figures of their last run)")


if __name__ == "__main__":
    main()
