"""Benchmark: a biased stage under the plain estimator, ``calibrated`` and ``learned`` -- side by side.

Acceptance: on the biased stage, drift > 1.5 under the plain estimator, within
1.0 +/- 0.15 under ``calibrated`` and within 1.0 +/- 0.05 under ``learned``
once each has learned from 200 settled jobs of that stage, all visible in one
``--by stage,version`` report.

The ledger is driven directly: each job is submitted with the plain estimate
(admission), ``shadows={calibrated.version: ..., learned.version: ...}`` and
the input tokens ``learned`` counted (``est_input``), ticked, and settled with
a biased, noisy actual. Both refit from the ledger every ``--refit`` settled
jobs per stage (``learned`` stores its state there, as ``lane estimators
refit`` does), minting a new version whenever a factor or allowance changes.

Stage model: by default flows/pipeline.py's own local model, corpus, prompts and
estimator (its ``critique`` stage writes far more than the estimator expects).
With ``--model synthetic``: a prompt of 200-6000 characters, the chars/4 estimator with an expected output
per stage, and actual = estimate x bias x lognormal(0, sigma) noise:
``draft`` bias 1.9 (the model writes far more than expected), ``review`` 1.0,
``summarize`` 0.55 (over-estimated: wasted admission room).

Usage::

    .venv/bin/python benchmarks/bench_calibration.py [--jobs 400] [--refit 100] [--seed 1]
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from lane_plugin import Ledger  # noqa: E402
from lane_plugin.estimators import TextLength, calibrated, learned, submit_kwargs  # noqa: E402
from lane_plugin.reports import drift, render  # noqa: E402

STAGES = {  # stage: (expected output tokens, bias of actual over the estimate, noise sigma)
    "draft": (800, 1.9, 0.35),
    "review": (200, 1.0, 0.25),
    "summarize": (300, 0.55, 0.25),
}


def synthetic_items(rng: random.Random, n: int):
    """``(stage, prompt, actual)`` of ``n`` items per stage of the synthetic model."""
    base = TextLength(expected_output={s: out for s, (out, _, _) in STAGES.items()})
    for stage, (_, bias, sigma) in STAGES.items():
        for _ in range(n):
            prompt = "x" * rng.randrange(200, 6000)
            yield stage, prompt, int(base.estimate(prompt, stage=stage) * bias * rng.lognormvariate(0, sigma))


def pipeline_items(rng: random.Random, n: int):
    """``(stage, text estimated, actual)`` of ``n`` documents through flows/pipeline.py's model and prompts."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "flows"))
    import pipeline as p

    model = p.LocalModel(seed=rng.randrange(1 << 30), latency=0.0)
    for doc in p.corpus(n, rng.randrange(1 << 30)):
        d = model.complete(f"Summarise:\n{doc}", stage="draft")
        c = model.complete(f"Critique this summary:\n{d.text}", stage="critique")
        f = model.complete(f"Rewrite using the critique:\n{doc}\n{c.text}", stage="final")
        # the texts the pipeline's estimators see (flows/pipeline.py: draft, critique, final)
        yield "draft", doc, d.usage.total_tokens
        yield "critique", d.text, c.usage.total_tokens
        yield "final", doc + c.text, f.usage.total_tokens


def run(jobs: int, refit: int, seed: int, url: str, model: str = "pipeline") -> tuple:
    rng = random.Random(seed)
    led = Ledger(url)
    led.set_lane("free", allowance=10**12, ceiling=10**12, burst_tokens=10**12, max_leased=100_000)
    if model == "pipeline":
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "flows"))
        import pipeline as p

        base, items, stages = p.ESTIMATOR, pipeline_items, ("draft", "critique", "final")
    else:
        base = TextLength(expected_output={s: out for s, (out, _, _) in STAGES.items()})
        items, stages = synthetic_items, tuple(STAGES)
    cal = calibrated(base, window=200)
    # until a stage has settled enough jobs, learned adds what the plain estimator expects it to write
    lrn = learned("gpt-4o", ledger=led, prior=base.expected if isinstance(base.expected, dict) else {})
    used_after_warmup: dict[str, set[str]] = {s: set() for s in stages}
    learned_after_warmup: dict[str, set[str]] = {s: set() for s in stages}
    settled = 0
    for batch_start in range(0, jobs, refit):
        n = min(refit, jobs - batch_start)
        ids = []
        for stage, text, actual in items(rng, n):
            kw = submit_kwargs(base, [cal, lrn], text, stage=stage)
            ids.append((led.submit(stage, **kw), actual))
            if batch_start >= 200:
                used_after_warmup[stage].add(cal.version)
                learned_after_warmup[stage].add(lrn.version)
        leased = {x.job_id for x in led.tick("free")}
        assert len(leased) == len(ids), f"admitted {len(leased)} of {len(ids)}"
        for jid, actual in ids:
            led.settle(jid, actual)
        settled += n
        changed = cal.refit(led)
        print(
            f"after {settled:>4} settled jobs per stage: factors {cal.factors} -> {cal.version}"
            + ("" if changed else " (unchanged)")
        )
        moved = lrn.refit().changed
        print(
            f"{'':>37}allowances {dict(sorted(lrn.learner.allowances.items()))} -> {lrn.version}"
            + ("" if moved else " (unchanged)")
        )
    report = drift(led, by="stage,version")
    return led, base, cal, report, used_after_warmup, learned_after_warmup


def warmed_up_drift(led: Ledger, versions: set[str], stage: str) -> float:
    """sum(actual) / sum(calibrated est) over the stage's jobs estimated by versions fitted on >= 200 jobs."""
    marks = ", ".join(f":v{i}" for i in range(len(versions)))
    params = {f"v{i}": v for i, v in enumerate(sorted(versions))}
    params["s"] = stage
    (_, rows) = led.rows(
        "select sum(j.actual), sum(s.est) from job j join shadow_estimate s on s.job_id = j.id "
        f"where j.state = 'done' and j.stage = :s and s.version in ({marks})",
        params,
    )
    actual, est = rows[0]
    return actual / est


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=400, help="settled jobs per stage")
    ap.add_argument("--refit", type=int, default=100, help="refit calibrated every this many jobs per stage")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument(
        "--model",
        choices=("pipeline", "synthetic"),
        default="pipeline",
        help="pipeline: flows/pipeline.py's model and estimator (its critique stage is biased); "
        "synthetic: three made-up stages, one biased x1.9, one over-estimated",
    )
    args = ap.parse_args()
    biased = "critique" if args.model == "pipeline" else "draft"
    with tempfile.TemporaryDirectory() as tmp:
        led, base, cal, report, used, used_learned = run(
            args.jobs, args.refit, args.seed, f"sqlite:///{tmp}/calibration.db", args.model
        )
        print()
        print(render(report, "table"))
        print()
        rows = report.set_index(["stage", "version"])
        plain = rows.loc[(biased, base.version), "drift"]
        after = warmed_up_drift(led, used[biased], biased) if used[biased] else float("nan")
        print(
            f"{biased} ({args.model} model), plain estimator {base.version}: drift {plain:.2f} "
            f"({'PASS' if plain > 1.5 else 'FAIL'}: > 1.5)"
        )
        print(
            f"{biased}, calibrated after 200 settled jobs ({len(used[biased])} version(s)): drift {after:.3f} "
            f"({'PASS' if abs(after - 1) <= 0.15 else 'FAIL'}: within 1.0 +/- 0.15)"
        )
        lrn_after = warmed_up_drift(led, used_learned[biased], biased) if used_learned[biased] else float("nan")
        print(
            f"{biased}, learned after 200 settled jobs ({len(used_learned[biased])} version(s)): drift "
            f"{lrn_after:.3f} ({'PASS' if abs(lrn_after - 1) <= 0.05 else 'FAIL'}: within 1.0 +/- 0.05)"
        )
        for stage in (s for s in used if s != biased):
            if used[stage]:
                print(
                    f"{stage}, plain {rows.loc[(stage, base.version), 'drift']:.2f}; after 200: calibrated "
                    f"{warmed_up_drift(led, used[stage], stage):.3f}, learned "
                    f"{warmed_up_drift(led, used_learned[stage], stage):.3f}"
                )
        led.close()


if __name__ == "__main__":
    main()
