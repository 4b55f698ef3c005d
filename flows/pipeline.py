"""A three-stage document pipeline (draft -> critique -> final) gated by ``@lane_task``.

The "model" runs locally with no network: it answers with a response shaped
like an OpenAI chat completion whose token usage is noisy around the truth.
Its critiques run long, so the default estimator (characters / 4 plus an
expected output per stage) underestimates the ``critique`` stage and the drift
report at the end has something to find.

Run it from the repository root (ephemeral Prefect, SQLite ledger under
PREFECT_HOME), or with ``PREFECT_API_URL`` pointing at ``prefect server start``,
unchanged:

    python flows/pipeline.py                       # 24 documents, seed 7
    python flows/pipeline.py --docs 60 --seed 3 --db sqlite:///demo.db

Example:
    >>> LocalModel(seed=1).complete("hello world", stage="draft").usage.total_tokens > 0
    True
"""

from __future__ import annotations

import argparse
import hashlib
import os
import random
import sys
import time
from dataclasses import dataclass, field

# The embedded default starts Prefect's ephemeral server; its 20 s start timeout is too short on a
# loaded 2-core machine (seen here). Read when the server starts, so set before Prefect is imported.
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "90")

from prefect import flow  # noqa: E402
from prefect.futures import as_completed
from prefect.runtime import flow_run as runtime_flow_run
from prefect.task_runners import ThreadPoolTaskRunner

from lane_plugin import Ledger, lane_task
from lane_plugin.errors import UnknownLane
from lane_plugin.estimators import TextLength
from lane_plugin.gating.bill import bill_rows
from lane_plugin.reports import drift, render

WORDS = (
    "token budget lane ledger admission queue lease settle drift estimate pipeline stage model "
    "prompt context summary critique draft final answer evidence claim source revise section"
).split()
# What the default estimator expects each stage to write, and what the model really writes.
EXPECTED_OUTPUT = {"draft": 320, "critique": 250, "final": 400}
TRUE_OUTPUT = {"draft": 320, "critique": 700, "final": 380}
ESTIMATOR = TextLength(expected_output=EXPECTED_OUTPUT)


@dataclass
class Usage:
    """Shaped like ``openai.types.CompletionUsage``."""

    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


@dataclass
class Completion:
    """Shaped like an OpenAI chat completion: the gate reads ``usage.total_tokens``."""

    text: str
    model: str
    usage: Usage = field(repr=False)


class LocalModel:
    """A deterministic stand-in for an LLM: same seed, stage and prompt, same answer.

    Prompt tokens are the prompt's characters / 4 with a little tokenizer noise;
    completion tokens are the stage's true output length with lognormal noise.
    """

    def __init__(self, seed: int = 7, latency: float = 0.01):
        self.seed, self.latency = seed, latency

    def complete(self, prompt: str, *, stage: str) -> Completion:
        digest = hashlib.sha256(f"{self.seed}:{stage}:{prompt}".encode()).hexdigest()
        rng = random.Random(int(digest[:16], 16))
        prompt_tokens = max(1, round(len(prompt) / 4 * rng.lognormvariate(0, 0.05)))
        completion_tokens = max(1, round(TRUE_OUTPUT[stage] * rng.lognormvariate(0, 0.25)))
        text = " ".join(rng.choice(WORDS) for _ in range(completion_tokens * 4 // 6))
        time.sleep(self.latency * (0.5 + rng.random()))
        usage = Usage(prompt_tokens, completion_tokens, prompt_tokens + completion_tokens)
        return Completion(text=text, model="local-noisy-1", usage=usage)


MODEL = LocalModel()


def corpus(n: int, seed: int) -> list[str]:
    """``n`` generated documents of 600 to 3,000 characters."""
    rng = random.Random(seed)
    docs = []
    for i in range(n):
        words, size = [], rng.randint(600, 3000)
        while sum(len(w) + 1 for w in words) < size:
            words.append(rng.choice(WORDS))
        docs.append(f"Document {i}. " + " ".join(words))
    return docs


DEMO_LANE = "demo"
# Room the demo lane gets per document, each run: about half of what a document's three stages spend
# (3,450 tokens on average), so the run outgrows the lane and its later stages fall back to `paid`.
ROOM_PER_DOC = 1_800
# The rest of the demo lane: 4 leases at once and 6,000 rate tokens per second (the provider's limit, as
# rate_cost counts it): jobs wait for both. The long appendix asks for more than a second's allowance at
# once, so the lane refuses it at intake.
DEMO_SETTINGS = dict(max_leased=4, burst_tokens=6_000, window_seconds=1.0, fallback="paid")
APPENDIX_CHARS = 40_000


@lane_task(stage="draft", estimate=ESTIMATOR, lane=DEMO_LANE, retries=2, retry_delay_seconds=0.5)
def draft(doc: str) -> Completion:
    return MODEL.complete(f"Summarise:\n{doc}", stage="draft")


@lane_task(
    stage="critique",
    estimate=lambda d: ESTIMATOR.estimate(d.text, stage="critique"),
    estimator_version=ESTIMATOR.version,
    lane=DEMO_LANE,
    fallback=True,  # the lane's fallback (paid) once the demo lane has no room left for it
    retries=2,
    retry_delay_seconds=0.5,
)
def critique(d: Completion) -> Completion:
    return MODEL.complete(f"Critique this summary:\n{d.text}", stage="critique")


@lane_task(
    stage="final",
    estimate=lambda doc, c: ESTIMATOR.estimate(doc + c.text, stage="final"),
    estimator_version=ESTIMATOR.version,
    lane=DEMO_LANE,
    fallback=True,
    retries=2,
    retry_delay_seconds=0.5,
)
def final(doc: str, c: Completion) -> Completion:
    return MODEL.complete(f"Rewrite using the critique:\n{doc}\n{c.text}", stage="final")


def documents(n: int, seed: int) -> list[str]:
    """:func:`corpus` with its last document (of two or more) replaced by a long appendix."""
    docs = corpus(n, seed)
    if n > 1:
        rng = random.Random(seed)
        words = [rng.choice(WORDS) for _ in range(APPENDIX_CHARS // 6)]
        docs[-1] = f"Document {n - 1} (appendix). " + " ".join(words)
    return docs


def give_room(ledger: Ledger, docs: int) -> int:
    """Give the demo lane room for this run: ``ROOM_PER_DOC`` tokens per document above what it has committed.

    The lane has no period, so its spend only grows: each run raises its ceiling by the run's room, as a
    fresh daily allowance would, so a second run on the same ledger is gated like the first.
    """
    room = docs * ROOM_PER_DOC
    try:
        row = ledger.lane(DEMO_LANE)
        committed = row.spent + row.reserved
    except UnknownLane:
        committed = 0
    ceiling = committed + room
    ledger.set_lane(DEMO_LANE, create=True, allowance=ceiling, ceiling=ceiling, **DEMO_SETTINGS)
    return room


@flow(name="document-pipeline", task_runner=ThreadPoolTaskRunner(max_workers=8))
def pipeline(docs: int = 24, seed: int = 7, db: str | None = None) -> dict:
    """Draft, critique and finalise ``docs`` generated documents in the demo lane.

    Returns ``tokens`` (by stage), ``refused`` (document number: why its draft was refused), ``room`` (what
    the demo lane was given) and ``run`` (the flow run id: the ledger's run key of its jobs).
    """
    if db:
        os.environ["LANE_DATABASE_URL"] = db  # the gate reads the ledger URL when a task starts
    MODEL.seed = seed
    room = give_room(Ledger(db), docs)
    texts = documents(docs, seed)
    drafts = {draft.submit(t): i for i, t in enumerate(texts)}
    later: list[tuple[str, object]] = [("draft", f) for f in drafts]
    refused: dict[int, str] = {}
    for f in as_completed(list(drafts)):  # a document goes on as soon as its draft is done
        outcome = f.result(raise_on_failure=False)
        if isinstance(outcome, BaseException):
            refused[drafts[f]] = str(outcome)
            continue
        c = critique.submit(f)
        later += [("critique", c), ("final", final.submit(texts[drafts[f]], c))]
    tokens: dict[str, int] = {"draft": 0, "critique": 0, "final": 0}
    for stage, f in later:
        outcome = f.result(raise_on_failure=False)
        if not isinstance(outcome, BaseException):
            tokens[stage] += outcome.usage.total_tokens
    return {"tokens": tokens, "refused": refused, "room": room, "run": str(runtime_flow_run.id)}


LANE_COLUMNS = ["lane", "ceiling", "spent", "reserved", "remaining", "pct_of_ceiling", "leased", "waiting", "parked"]
BILL_COLUMNS = ["stage", "lane", "jobs", "estimated", "actual", "drift", "wait_p50_s", "wait_max_s"]


def admission(ledger: Ledger, result: dict) -> str:
    """What admission did to this run, in words: its waits, its refusals and what fell back to ``paid``."""
    lines = ledger.run_bill(result["run"])
    lane = ledger.lane(DEMO_LANE)
    waits = [b.wait_max for b in lines if b.wait_max]
    fell = [b for b in lines if b.lane == lane.fallback]
    out = [
        f"Admission in lane {DEMO_LANE!r}: room for {result['room']:,} tokens this run, {lane.max_leased} leases at "
        f"once, {lane.burst_tokens:,} rate tokens per {lane.window_seconds:g}s, falls back to {lane.fallback!r}"
    ]
    medians = ", ".join(f"{b.stage} {b.wait_p50:.2f}s" for b in lines if b.lane == DEMO_LANE and b.wait_p50 is not None)
    out.append(
        f"  waits: up to {max(waits):.2f}s (median in lane {DEMO_LANE!r}: {medians})" if waits else "  waits: none"
    )
    for i, why in sorted(result["refused"].items()):
        out.append(f"  refused: document {i}: {why}")
    if fell:
        moved = ", ".join(f"{b.jobs} {b.stage}" for b in fell)
        out.append(
            f"  fallback: {sum(b.jobs for b in fell)} jobs ({moved}) went to lane {lane.fallback!r}: lane {DEMO_LANE!r} "
            f"had no room left for them (spent {lane.spent:,} of its ceiling {lane.ceiling:,})"
        )
    else:
        out.append(f"  fallback: none (lane {DEMO_LANE!r} had room for every job)")
    return "\n".join(out)


def bill(ledger: Ledger, run: str):
    """This run's bill per stage and lane (the flow run's ``lane-bill`` artifact), as a DataFrame."""
    import pandas as pd

    table = pd.DataFrame(bill_rows(ledger.run_bill(run)))[BILL_COLUMNS]
    table["drift"] = table["drift"].map(lambda d: "-" if d != d or d is None else f"{d:.2f}")
    table = table.astype(object)
    return table.where(table.notna(), "-")


def report(ledger: Ledger, since: float | None) -> str:
    """The lane status and this run's drift report, as printed at the end of a run."""
    import pandas as pd

    lanes = pd.DataFrame(ledger.lanes())[LANE_COLUMNS]
    lanes["pct_of_ceiling"] = lanes["pct_of_ceiling"].map(lambda p: f"{p:.1f}%")
    table = render(drift(ledger, since=since))
    return f"Lane status ({ledger.url}):\n{lanes.to_string(index=False)}\n\nDrift report (this run):\n{table}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--docs", type=int, default=24, help="documents to generate (default 24)")
    parser.add_argument("--seed", type=int, default=7, help="corpus and model seed (default 7)")
    parser.add_argument("--db", default=None, help="ledger URL (default LANE_DATABASE_URL or lane.db in PREFECT_HOME)")
    args = parser.parse_args(argv)
    if args.docs < 1:
        parser.error(f"--docs must be at least 1 (got {args.docs})")
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    started = time.time()
    result = pipeline(docs=args.docs, seed=args.seed, db=args.db)
    led = Ledger(args.db)
    print(f"\nTokens by stage: {result['tokens']} in {time.time() - started:.1f}s\n")
    print(admission(led, result) + "\n")
    print(f"Bill of this run (flow run {result['run']}):\n{bill(led, result['run']).to_string(index=False)}\n")
    print(report(led, since=time.time() - started + 1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
