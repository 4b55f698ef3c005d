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
from prefect.task_runners import ThreadPoolTaskRunner

from lane_plugin import Ledger, lane_task
from lane_plugin.estimators import TextLength
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


@lane_task(stage="draft", estimate=ESTIMATOR, retries=2, retry_delay_seconds=0.5)
def draft(doc: str) -> Completion:
    return MODEL.complete(f"Summarise:\n{doc}", stage="draft")


@lane_task(
    stage="critique",
    estimate=lambda d: ESTIMATOR.estimate(d.text, stage="critique"),
    estimator_version=ESTIMATOR.version,
    retries=2,
    retry_delay_seconds=0.5,
)
def critique(d: Completion) -> Completion:
    return MODEL.complete(f"Critique this summary:\n{d.text}", stage="critique")


@lane_task(
    stage="final",
    estimate=lambda doc, c: ESTIMATOR.estimate(doc + c.text, stage="final"),
    estimator_version=ESTIMATOR.version,
    retries=2,
    retry_delay_seconds=0.5,
)
def final(doc: str, c: Completion) -> Completion:
    return MODEL.complete(f"Rewrite using the critique:\n{doc}\n{c.text}", stage="final")


@flow(name="document-pipeline", task_runner=ThreadPoolTaskRunner(max_workers=8))
def pipeline(docs: int = 24, seed: int = 7, db: str | None = None) -> dict:
    """Draft, critique and finalise ``docs`` generated documents; returns token totals by stage."""
    if db:
        os.environ["LANE_DATABASE_URL"] = db  # the gate reads the ledger URL when a task starts
    MODEL.seed = seed
    texts = corpus(docs, seed)
    drafts = [draft.submit(t) for t in texts]
    critiques = [critique.submit(d) for d in drafts]
    finals = [final.submit(t, c) for t, c in zip(texts, critiques)]
    totals: dict[str, int] = {}
    for stage, futures in (("draft", drafts), ("critique", critiques), ("final", finals)):
        totals[stage] = sum(f.result().usage.total_tokens for f in futures)
    return totals


LANE_COLUMNS = ["lane", "ceiling", "spent", "reserved", "remaining", "pct_of_ceiling", "leased", "waiting", "parked"]


def report(ledger: Ledger, since: float | None) -> str:
    """The lane status and this run's drift report, as printed at the end of a run."""
    import pandas as pd

    lanes = pd.DataFrame(ledger.lanes())[LANE_COLUMNS]
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
    totals = pipeline(docs=args.docs, seed=args.seed, db=args.db)
    print(f"\nTokens by stage: {totals} in {time.time() - started:.1f}s\n")
    print(report(Ledger(args.db), since=time.time() - started + 1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
