"""Issue 24's variants of the provider benchmark (``bench_provider.py --limits``): limits as providers state them.

Every variant is a Prefect flow on the ephemeral server (thread pool of ``--workers``) running
20 documents x 3 stages (draft, critique, final: each stage of a document after the one before) =
60 calls through a real SDK over HTTP against the emulator, and is measured against the bound of its
binding limit (the least time the provider allows the workload: total units / limit x window):

1. **RPM-bound** (OpenAI style, 12 requests per 10 s, tokens practically unlimited): plain ``@task`` with
   the SDK's retries beside ``@lane_task`` on a lane with ``requests=12/10s``. Target: 0 x 429, wall
   <= 1.2x the requests bound.
2. **Requests and tokens both binding** (OpenAI style): ``requests=12/10s`` and ``tokens=TPM/10s`` with
   ``rate_cost = prompt + max_tokens``. Target: 0 x 429, <= 1.15x the binding bound.
3. **Anthropic style** (input and output tokens per window, output counted as generated; outputs from
   the trace): ``input_tokens`` and ``output_tokens`` limits, ``rate_cost={"input": prompt, "output":
   the stage's learned allowance}`` (what the ``learned`` estimator publishes for the stage, learned here
   from the trace's outputs capped at ``max_tokens``: their mean; a job with a ``learned`` estimate and no
   ``rate_cost`` splits itself the same way), trued up to the generated output at settlement. Target: 0 x 429, <= 1.2x the binding bound.
4. **Shared key**: a client outside the lane spends about 40% of the tokens limit at random moments. With
   ``track_limits``: <= 3 responses 429 per 100 calls and <= 1.3x the bound of what is left (60% of the
   limit). Without it: every 429 pauses every worker, so requests sent into a closed window = 0: the emulator
   counts a request arriving before a 429's reset as sent into it when it was sent (each request stamps
   ``x-client-sent-at`` in the client's request hook, the moment httpx takes it) after the client had that
   429's answer in hand (its transport tells the emulator the moment the answer came back,
   :meth:`ProviderEmulator.received`), and apart, as in flight, when it was sent before (no client can hold
   back a request for an answer it does not have yet). ``answer`` counts the former against the moment the
   emulator wrote the answer out instead (a few milliseconds earlier on this machine).

``@lane_task`` runs with the SDK's retries off (``max_retries=0``) and Prefect retries: the lane waits,
not the SDK.
"""

from __future__ import annotations

import random
import threading
import time
from typing import Any

STAGES = ("draft", "critique", "final")
DOCS = 20
WINDOW = 10.0
RPM = 12


def _prompt(doc: int, stage: str, tokens: int) -> list[dict]:
    text = f"{stage} {doc}: " + "word" * tokens
    return [{"role": "user", "content": text[: tokens * 4]}]


def workload(trace: str, seed: int, max_tokens: int) -> list[tuple[int, str, int, int]]:
    """``(doc, stage, prompt_tokens, max_tokens)`` of the 60 calls: prompts from the trace's inputs, capped small."""
    from lane_plugin.testing import load_trace

    inputs = [min(i, 1_500) for i, _ in load_trace(trace) if i > 0]
    rng = random.Random(seed)
    return [(d, s, rng.choice(inputs), max_tokens) for d in range(DOCS) for s in STAGES]


def _flow(fns: dict[str, Any], work, workers: int, name: str) -> dict:
    """Submit each document's three stages, each after the one before; wall from first submit to last result."""
    from prefect import flow
    from prefect.futures import wait
    from prefect.task_runners import ThreadPoolTaskRunner

    @flow(name=name, task_runner=ThreadPoolTaskRunner(max_workers=workers))
    def run() -> dict:
        t0 = time.perf_counter()
        prev: dict[int, Any] = {}
        futures = []
        for stage in STAGES:
            for d, _stage, p, m in (w for w in work if w[1] == stage):
                f = fns[stage].submit(d, p, m, wait_for=[prev[d]] if d in prev else None)
                prev[d] = f
                futures.append(f)
        wait(futures)
        wall = time.perf_counter() - t0
        failed = [f.state for f in futures if not f.state.is_completed()]
        return {"wall": wall, "failed": len(failed), "first_error": failed[0].message if failed else None}

    return run()


def _tasks(call, lane: str | None, url: str, rate_cost=None, retries: int = 6) -> dict[str, Any]:
    """A task per stage: plain ``@task`` (lane None) or ``@lane_task`` in ``lane``."""
    from prefect import task

    from lane_plugin import lane_task

    def make(stage: str):
        def body(doc: int, prompt_tokens: int, max_tokens: int):
            return call(doc, stage, prompt_tokens, max_tokens)

        return body

    out = {}
    for stage in STAGES:
        body = make(stage)
        if lane is None:
            out[stage] = task(name=f"plain-{stage}", task_run_name=f"{stage}-{{doc}}")(body)
        else:
            opts = {} if rate_cost is None else {"rate_cost": rate_cost}
            out[stage] = lane_task(
                stage=stage,
                estimate=lambda doc, prompt_tokens, max_tokens: prompt_tokens + max_tokens,
                lane=lane,
                ledger=url,
                retries=retries,
                retry_delay_seconds=0,
                task_run_name=f"{stage}-{{doc}}",
                **opts,
            )(body)
    return out


def _stamp(request) -> None:
    """The moment httpx takes the request (before the lane's send guard looks at it), for the emulator to tell a
    request sent after a 429's answer from one already on its way (``x-client-sent-at``)."""
    request.headers["x-client-sent-at"] = repr(time.time())


def _http_client(sdk, emu):
    """The SDK's default httpx client, stamping each request and telling ``emu`` when each 429's answer arrived."""
    import importlib

    # the httpx package the SDK sends through (httpx, or its fork httpx2)
    base = next(c for c in sdk.DefaultHttpxClient.__mro__ if c.__name__ == "Client")
    httpx = importlib.import_module(base.__module__.split(".")[0])

    class Receipts(httpx.HTTPTransport):
        def handle_request(self, request):
            response = super().handle_request(request)
            if response.status_code == 429 and emu is not None:  # the earliest the client has it in hand
                emu.received(response.headers.get("x-request-id") or response.headers.get("request-id"), time.time())
            return response

    return sdk.DefaultHttpxClient(transport=Receipts(), event_hooks={"request": [_stamp]})


def _openai_call(emu, retries: int, hook=None):
    import openai
    from openai import OpenAI

    client = OpenAI(
        base_url=emu.base_url, api_key="bench", max_retries=retries, timeout=120, http_client=_http_client(openai, emu)
    )
    if hook is not None:
        client = hook(client)

    def call(doc: int, stage: str, prompt_tokens: int, max_tokens: int):
        return client.chat.completions.create(
            model="emu-1", messages=_prompt(doc, stage, prompt_tokens), max_tokens=max_tokens
        )

    return call


def _anthropic_call(emu):
    import anthropic
    from anthropic import Anthropic

    base_url = emu.base_url.removesuffix("/v1")
    client = Anthropic(
        base_url=base_url, api_key="bench", max_retries=0, timeout=120, http_client=_http_client(anthropic, emu)
    )

    def call(doc: int, stage: str, prompt_tokens: int, max_tokens: int):
        return client.messages.create(model="emu-1", messages=_prompt(doc, stage, prompt_tokens), max_tokens=max_tokens)

    return call


def _outside(emu, share: float, tpm: int, stop: threading.Event, seed: int) -> None:
    """Another client on the key: about ``share`` of the tokens limit, in random chunks at random moments."""
    rng = random.Random(seed)
    rate = share * tpm / WINDOW  # tokens per second
    while not stop.is_set():
        gap = rng.uniform(0.1, 0.9)
        stop.wait(gap)
        emu.spend_outside(max(1, int(rate * gap * rng.uniform(0.5, 1.5))))


def _refusals(records) -> list:
    """``(the arrival before it, the 429)`` of each 429 (a 429 arriving 0.3 s after any other request: a lone probe)."""
    out, last = [], float("-inf")
    for r in records:
        if r.status == 429:
            out.append((last, r))
        last = r.t
    return out


def _ms(seconds: float | None) -> str:
    return "?" if seconds is None else f"{seconds * 1000:+.0f}"


def _row(name: str, r: dict, bound: float, calls: int, target: str) -> str:
    per100 = 100 * r["rejected_429"] / calls
    return (
        f"{name:<44} {r['rejected_429']:>5} {per100:>7.1f} {r['failed']:>3}/{calls:<3} {r['wall']:>7.1f} "
        f"{bound:>7.1f} {r['wall'] / bound:>7.2f} {r['sent_into_closed']:>7} {r['in_flight_at_429']:>6} "
        f"{r['sent_after_answer']:>6}  "
        f"{target}"
    )


def run(args, url_for) -> str:
    """Run every variant once; the markdown section (``docs/performance_provider_limits.md``)."""
    import anthropic
    import openai
    import prefect

    from lane_plugin import Ledger, track_limits
    from lane_plugin.testing import ProviderEmulator, load_trace

    t_start = time.perf_counter()
    work = workload(args.trace, args.seed, 64)
    calls = len(work)
    outputs = [o for _, o in load_trace(args.trace)]
    common = dict(
        trace=args.trace,
        seed=args.seed,
        latency_base=args.latency_base,
        latency_per_token=args.latency_per_token,
        window_seconds=WINDOW,
    )
    rows, notes = [], []
    total_rate = sum(p + m for *_, p, m in work)
    req_bound = calls / RPM * WINDOW

    def measure(name, emu, fns, bound, target, ledger_url=None, extra=None):
        if args.only and name[0] not in args.only:
            return None
        print(f"running {name} ...", flush=True)
        emu.reset()
        stop = threading.Event()
        th = None
        if extra is not None:
            th = threading.Thread(target=extra, args=(emu, stop), daemon=True)
            th.start()
        out = _flow(fns, work, args.workers, "bench-limits")
        stop.set()
        if th is not None:
            th.join()
        out.update(emu.stats())
        rows.append(_row(name, out, bound, calls, target))
        gated = ledger_url is not None  # the notes list a lane's 429s, not those of the plain tasks beside it
        if gated and out["rejected_429"]:
            refused = [
                f"{r.t:.1f} s ({r.limit}{', probe' if r.t - last > 0.3 else ''})" for last, r in _refusals(emu.records)
            ]
            notes.append(
                f"{name}: 429s at {', '.join(refused)}; outside spend {out['outside_ok']} sent, "
                f"{out['outside_refused']} refused"
            )
        if gated and out["closed_arrivals"]:
            seen = "; ".join(
                f"{'sent into it' if a['into_closed'] else 'in flight'} (sent "
                f"{_ms(a['sent_after_answer'])} ms after the answer was written, "
                f"{_ms(a['sent_after_receipt'])} ms after the client had it, arrived "
                f"{a['after_429'] * 1000:.0f} ms after the 429, {a['status']})"
                for a in out["closed_arrivals"]
            )
            notes.append(f"{name}: arrived while a 429 said to wait: {seen}")
        if out["first_error"]:
            notes.append(f"{name}: first failure: {out['first_error'][:200]}")
        if ledger_url is not None:
            audit = Ledger(ledger_url).audit()
            notes.append(f"{name}: ledger audit {'sound' if not audit else audit}")
        return out

    # 1. RPM-bound
    with ProviderEmulator(tpm=10**9, rpm=RPM, **common) as emu:
        measure(
            "1 RPM-bound: @task + SDK retries", emu, _tasks(_openai_call(emu, 2), None, ""), req_bound, "(beside it)"
        )
        url = url_for("rpm")
        Ledger(url).set_lane(
            "rpm",
            allowance=10**12,
            ceiling=10**12,
            max_leased=1_000,
            limits=[f"requests={RPM}/{WINDOW:g}s", "tokens=none"],
        )
        measure(
            "1 RPM-bound: @lane_task", emu, _tasks(_openai_call(emu, 0), "rpm", url), req_bound, "0 x 429, <= 1.2x", url
        )
    # 2. requests and tokens both binding
    tpm = int(total_rate * WINDOW / req_bound)
    bound2 = max(req_bound, total_rate / tpm * WINDOW)
    with ProviderEmulator(tpm=tpm, rpm=RPM, **common) as emu:
        url = url_for("both")
        Ledger(url).set_lane(
            "both",
            allowance=10**12,
            ceiling=10**12,
            max_leased=1_000,
            limits=[f"requests={RPM}/{WINDOW:g}s", f"tokens={tpm}/{WINDOW:g}s"],
        )
        measure(
            "2 requests + tokens: @lane_task",
            emu,
            _tasks(
                _openai_call(emu, 0),
                "both",
                url,
                rate_cost=lambda doc, prompt_tokens, max_tokens: prompt_tokens + max_tokens,
            ),
            bound2,
            "0 x 429, <= 1.15x",
            url,
        )
    # 3. Anthropic style: input and output tokens per window, output as generated
    from lane_plugin.estimators.learner import OutputLearner
    from lane_plugin.testing.limits import draw_length

    def generated(d, s, p, m):
        return min(draw_length(outputs, args.seed, {"model": "emu-1", "messages": _prompt(d, s, p)}), m)

    total_in = sum(p for *_, p, _m in work)
    total_out = sum(generated(*w) for w in work)
    otpm = max(64, int(total_out * WINDOW / req_bound))
    itpm = max(max(p for *_, p, _m in work), int(total_in * WINDOW / (0.8 * req_bound)))
    capped = [min(o, 64) for o in outputs]
    # what the learned estimator publishes for the stage (its OutputLearner, fed the trace's calls)
    learner = OutputLearner()
    for o in capped:
        learner.observe("stage", 0, o)
    allowance = learner.allowances["stage"]
    bound3 = max(total_in / itpm, total_out / otpm) * WINDOW
    with ProviderEmulator(tpm=10**9, rpm=None, itpm=itpm, otpm=otpm, **common) as emu:
        url = url_for("anth")
        Ledger(url).set_lane(
            "anth",
            allowance=10**12,
            ceiling=10**12,
            max_leased=1_000,
            limits=[f"input_tokens={itpm}/{WINDOW:g}s", f"output_tokens={otpm}/{WINDOW:g}s", "tokens=none"],
        )
        measure(
            "3 Anthropic style: @lane_task",
            emu,
            _tasks(
                _anthropic_call(emu),
                "anth",
                url,
                rate_cost=lambda doc, prompt_tokens, max_tokens: {"input": prompt_tokens, "output": allowance},
            ),
            bound3,
            "0 x 429, <= 1.2x",
            url,
        )
    # 4. shared key: 40% of the tokens limit spent outside the lane
    tpm4 = int(total_rate * WINDOW / (0.6 * req_bound))
    bound4 = total_rate / (0.6 * tpm4) * WINDOW

    def outside(emu, stop):
        _outside(emu, 0.4, tpm4, stop, args.seed)

    with ProviderEmulator(tpm=tpm4, rpm=None, **common) as emu:
        cost = lambda doc, prompt_tokens, max_tokens: prompt_tokens + max_tokens  # noqa: E731
        url = url_for("shared")
        Ledger(url).set_lane(
            "shared", allowance=10**12, ceiling=10**12, max_leased=1_000, limits=[f"tokens={tpm4}/{WINDOW:g}s"]
        )
        measure(
            "4 shared key: @lane_task + track_limits",
            emu,
            _tasks(
                _openai_call(emu, 0, hook=lambda c: track_limits(c, lane="shared", ledger=url)),
                "shared",
                url,
                rate_cost=cost,
            ),
            bound4,
            "<= 3 x 429 per 100, <= 1.3x of what is left",
            url,
            extra=outside,
        )
        url = url_for("shared2")
        Ledger(url).set_lane(
            "shared2", allowance=10**12, ceiling=10**12, max_leased=1_000, limits=[f"tokens={tpm4}/{WINDOW:g}s"]
        )
        measure(
            "4 shared key: @lane_task, no track_limits",
            emu,
            _tasks(_openai_call(emu, 0), "shared2", url, rate_cost=cost),
            bound4,
            "sent into a closed window = 0",
            url,
            extra=outside,
        )
    header = (
        f"{'variant':<44} {'429s':>5} {'/100':>7} {'failed':>7} {'wall s':>7} {'bound':>7} {'x bound':>7} "
        f"{'closed':>7} {'flight':>6} {'answer':>6}  target"
    )
    lines = [
        "## Provider limits (issue 24): requests, tokens, input and output, a 429 heard by every worker",
        "",
        "Command: `python benchmarks/bench_provider.py --limits`",
        "",
        f"Prefect {prefect.__version__} ephemeral server, openai {openai.__version__}, anthropic "
        f"{anthropic.__version__}, SQLite ledgers; thread pool of {args.workers}; total "
        f"{time.perf_counter() - t_start:.0f} s. Workload: {DOCS} documents x {len(STAGES)} stages = {calls} calls, "
        f"prompts from {args.trace}'s inputs (at most 1,500 tokens), max_tokens 64; window {WINDOW:g} s; latency "
        f"{args.latency_base:g} s + {args.latency_per_token * 1000:g} ms/token.",
        "",
        f"- 1: RPM {RPM} per {WINDOW:g} s, tokens unlimited: requests bound {req_bound:.1f} s.",
        f"- 2: RPM {RPM} and TPM {tpm:,} per {WINDOW:g} s ({total_rate:,} rate tokens): bound {bound2:.1f} s.",
        f"- 3: input {itpm:,} and output {otpm:,} tokens per {WINDOW:g} s ({total_in:,} input, {total_out:,} "
        f"output generated; learned output allowance {allowance}: what the learned estimator publishes, learned from "
        f"the trace's outputs capped at max_tokens): bound {bound3:.1f} s.",
        f"- 4: TPM {tpm4:,} per {WINDOW:g} s, about 40% spent outside the lane: bound of what is left {bound4:.1f} s.",
        "",
        "```",
        header,
        "-" * len(header),
        *rows,
        "```",
        "",
        "429s: responses 429 the provider sent the workload; /100: per 100 calls; wall: first submit to last "
        "result; bound: the binding limit's; closed: requests sent into a closed window (sent after the client had "
        "the answer of a 429 that still said to wait); flight: requests that arrived while a 429 said to wait but were "
        "sent before the client had its answer (no client can hold those back); answer: requests sent after such a "
        "429's answer was written out by the emulator (closed, plus those sent while it was on its way to the client).",
        "",
        *[f"- {n}" for n in notes],
        "",
    ]
    return "\n".join(lines)
