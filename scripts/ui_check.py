"""Look at what a user sees in the Prefect UI for a gated flow run, in headless Chromium.

Runs one small gated flow against the Prefect server at ``PREFECT_API_URL``, then opens the flow
run, its ``lane-bill`` artifact, the task run's log and the event feed, prints the text each page
shows about tokens, and saves a screenshot of each into ``--out``. Needs Playwright and a Chromium
(not project dependencies): ``pip install playwright`` and Debian's ``chromium`` package.

    prefect server start --port 4299 &
    PREFECT_API_URL=http://127.0.0.1:4299/api python scripts/ui_check.py --out /tmp/screens
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from prefect import flow
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey, FlowRunFilter, FlowRunFilterId
from prefect.runtime import flow_run

from lane_plugin import lane_task


@lane_task(stage="draft", estimate=1200, lane="free")
def draft(n: int):
    return {"usage": {"total_tokens": 1340}}  # an LLM response's usage: 140 over the estimate


@flow(name="ui-check")
def ui_check() -> str:
    draft(1)
    return flow_run.get_id()


def _lines(text: str, *needles: str) -> list[str]:
    return [line for line in text.splitlines() if any(n in line for n in needles)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("ui-screens"), help="where screenshots go")
    parser.add_argument("--chromium", default="/usr/bin/chromium", help="Chromium executable")
    args = parser.parse_args()
    api = os.environ.get("PREFECT_API_URL")
    if not api:
        parser.error("set PREFECT_API_URL to a running `prefect server start` (its UI is what we look at)")
    ui = api.removesuffix("/api")
    from playwright.sync_api import sync_playwright

    run_id = ui_check()
    with get_client(sync_client=True) as client:
        runs = FlowRunFilter(id=FlowRunFilterId(any_=[run_id]))
        [task_run] = client.read_task_runs(flow_run_filter=runs)
        [bill] = client.read_artifacts(flow_run_filter=runs, artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["lane-bill"])))
    args.out.mkdir(parents=True, exist_ok=True)
    pages = {
        "flow-run-log": (f"{ui}/runs/flow-run/{run_id}", ("lane gate", "lane-bill")),
        "lane-bill": (f"{ui}/artifacts/artifact/{bill.id}", ("tokens", "draft", "1340", "estimated")),
        "task-run-log": (f"{ui}/runs/task-run/{task_run.id}", ("lane gate",)),
        "event-card": (f"{ui}/events?events=lane.job.admitted&events=lane.job.settled", ("lane.tokens",)),
    }
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=args.chromium, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        for name, (url, needles) in pages.items():
            page.goto(url)
            time.sleep(6)  # the UI fetches after load
            shot = args.out / f"{name}.png"
            page.screenshot(path=str(shot), full_page=True)
            print(f"== {name}: {url} -> {shot}")
            for line in _lines(page.inner_text("body"), *needles) or ["(nothing about tokens on this page)"]:
                print(f"   {line}")
        browser.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
