"""What a user sees about tokens in the Prefect UI, in headless Chromium against a real ``prefect server start``.

One gated flow run of tenant team-docs (estimate 1,200, the body reports 1,340) through scripts/ui_check.py; then its flow
run page, its ``lane-bill`` artifact, its task run page and the event feed must each show its tokens.
Skipped, with the reason, where Playwright or a Chromium is missing, unless LANE_REQUIRE_BROWSER=1
(.ci/run installs Debian's chromium and sets it), where that is a failure.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from lane_plugin.testing.prefect_server import real_server

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "ui_check.py"


def _chromium() -> str:
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        missing = "Playwright is not installed (pip install -e '.[dev]')"
    else:
        found = os.environ.get("LANE_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
        if found:
            return found
        missing = "no Chromium on PATH (Debian: apt-get install chromium; or set LANE_CHROMIUM)"
    if os.environ.get("LANE_REQUIRE_BROWSER") == "1":
        pytest.fail(missing + " (LANE_REQUIRE_BROWSER=1)")
    pytest.skip(missing)


def test_the_prefect_ui_shows_a_gated_run_s_tokens(tmp_path):
    chromium = _chromium()
    with real_server(tmp_path, ui=True) as (api, env):
        # tests run at WARNING
        env = dict(env, LANE_DATABASE_URL=f"sqlite:///{tmp_path / 'lane.db'}", PREFECT_LOGGING_LEVEL="INFO")
        out = subprocess.run(
            [
                sys.executable,
                str(SCRIPT),
                "--json",
                "--timeout",
                "60",
                "--chromium",
                chromium,
                "--out",
                str(tmp_path / "screens"),
            ],
            env=env,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=300,
        )
    assert out.stdout.strip(), out.stderr[-3000:]
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    # The pages loaded and talked to this server (not the UI's default port 4200).
    assert all("Can't connect" not in line for page in seen.values() for line in page["lines"]), seen
    assert (
        {name for name, page in seen.items() if page["shown"]}
        == set(seen)
        == {"flow-run-log", "lane-bill", "task-run-log", "event-card"}
    ), seen
    settled = "lane gate: draft settled 1,340 tokens (estimate 1,200, drift 1.12, overage 140)"
    assert any(line.startswith(settled) for line in seen["task-run-log"]["lines"]), seen["task-run-log"]
    assert any(line.startswith(settled) for line in seen["flow-run-log"]["lines"]), seen["flow-run-log"]
    bill = seen["lane-bill"]["lines"]
    assert any(
        "1 gated job(s) of this flow run (Completed): 1,340 tokens billed against 1,200 estimated (drift 1.12)" in line
        for line in bill
    ), bill
    assert any(
        line.startswith("stage lane tenant jobs estimated actual drift overage")
        and line.endswith(" unsettled rate_limited_429")
        for line in bill
    ), bill
    assert "team-docs" in bill, bill  # the tenant the task was submitted for (issue 23), a cell of its own
    assert any(line.startswith("1 1200 1340 1.12 140") and line.endswith(" 0") for line in bill), bill  # ... 0 429s
    assert "lane.tokens: free, estimate 1,200 tokens, actual 1,340" in seen["event-card"]["lines"], seen["event-card"]
    assert out.returncode == 0, out.stderr[-3000:]
