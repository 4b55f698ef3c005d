"""Look at what a user sees in the Prefect UI for a gated flow run, in headless Chromium.

Runs one small gated flow against the Prefect server at ``PREFECT_API_URL``, then opens the flow
run, its ``lane-bill`` artifact, the task run's log and the event feed, waits until each page shows
its tokens, prints the lines about them, and saves a screenshot of each into ``--out``. Exits 1 if
a page never shows them. Needs Playwright and a Chromium: ``pip install -e '.[dev]'`` brings
Playwright, Debian's ``chromium`` package the browser. tests/e2e/test_ui.py runs it.

The server must know its own port (``PREFECT_API_URL`` in its environment too): its UI otherwise
calls the API on port 4200 and every page says "Can't connect to Server API".

    PREFECT_API_URL=http://127.0.0.1:4299/api prefect server start --port 4299 &
    PREFECT_API_URL=http://127.0.0.1:4299/api python scripts/ui_check.py --out /tmp/screens
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from prefect import flow
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey, FlowRunFilter, FlowRunFilterId
from prefect.logging.handlers import APILogHandler
from prefect.runtime import flow_run

from lane_plugin import lane_task

UNREACHABLE = "Can't connect to Server API"


@lane_task(stage="draft", estimate=1200, lane="free", tenant="team-docs")
def draft(n: int):
    return {"usage": {"total_tokens": 1340}}  # an LLM response's usage: 140 over the estimate


@flow(name="ui-check")
def ui_check() -> str:
    draft(1)
    return flow_run.get_id()


def _lines(text: str, *needles: str) -> list[str]:
    return [" ".join(line.split()) for line in text.splitlines() if any(n in line for n in needles)]


def pages(ui: str, run_id: str, task_run_id: str, bill_id: str) -> dict[str, tuple[str, str, tuple[str, ...]]]:
    """Each page: its URL, the text it shows once loaded, and what lines to print from it."""
    return {
        "flow-run-log": (f"{ui}/runs/flow-run/{run_id}", "lane gate: draft settled", ("lane gate", "lane bill")),
        "lane-bill": (f"{ui}/artifacts/artifact/{bill_id}", "tokens billed against", ("tokens", "draft", "estimated", "1340", "team-docs")),
        "task-run-log": (f"{ui}/runs/task-run/{task_run_id}", "lane gate: draft settled", ("lane gate",)),
        "event-card": (f"{ui}/events?events=lane.job.admitted&events=lane.job.settled", "lane.tokens", ("lane.tokens",)),
    }  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("ui-screens"), help="where screenshots go")
    parser.add_argument("--chromium", default="/usr/bin/chromium", help="Chromium executable")
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds a page may take to show its tokens")
    parser.add_argument("--json", action="store_true", help="print one JSON object {page: {url, shown, lines}}")
    args = parser.parse_args()
    api = os.environ.get("PREFECT_API_URL")
    if not api:
        parser.error("set PREFECT_API_URL to a running `prefect server start` (its UI is what we look at)")
    ui = api.removesuffix("/api")
    from playwright.sync_api import TimeoutError as PlaywrightTimeout
    from playwright.sync_api import sync_playwright

    run_id = ui_check()
    APILogHandler().flush()  # the run's logs sent to the server before its pages are opened
    with get_client(sync_client=True) as client:
        runs = FlowRunFilter(id=FlowRunFilterId(any_=[run_id]))
        [task_run] = client.read_task_runs(flow_run_filter=runs)
        [bill] = client.read_artifacts(flow_run_filter=runs, artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["lane-bill"])))
    args.out.mkdir(parents=True, exist_ok=True)
    seen: dict[str, dict] = {}
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=args.chromium, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        for name, (url, ready, needles) in pages(ui, run_id, str(task_run.id), str(bill.id)).items():
            # The UI fetches once after load, and the server may store a run's last logs a little later:
            # load the page again until it shows the tokens (or the UI's own "can't connect" notice).
            wanted = json.dumps([ready, UNREACHABLE])
            deadline = time.monotonic() + args.timeout
            while True:
                page.goto(url)
                try:
                    page.wait_for_function(f"{wanted}.some(t => document.body.innerText.includes(t))",
                                           timeout=max(1.0, min(8.0, deadline - time.monotonic())) * 1000)  # fmt: skip
                    break
                except PlaywrightTimeout:
                    if time.monotonic() >= deadline:
                        break
            text = page.inner_text("body")
            shot = args.out / f"{name}.png"
            page.screenshot(path=str(shot), full_page=True)
            shown = ready in text
            seen[name] = {"url": url, "shown": shown, "lines": _lines(text, *needles, UNREACHABLE)}
            if not args.json:
                print(f"== {name}: {url} -> {shot}" + ("" if shown else f" (NOT SHOWN: no {ready!r} within {args.timeout:g}s)"))
                for line in seen[name]["lines"] or ["(nothing about tokens on this page)"]:
                    print(f"   {line}")
        browser.close()
    if args.json:
        print(json.dumps(seen))
    return 0 if all(s["shown"] for s in seen.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
