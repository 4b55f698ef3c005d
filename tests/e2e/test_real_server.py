"""End to end against a real ``prefect server start``: serve the drift report, trigger it, read the artifact.

Everything runs in a temporary PREFECT_HOME with its own SQLite databases on a
free loopback port; the server and the serving process are started in their
own process groups and killed in ``finally``. Takes ~30-60 s on two cores.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from lane_plugin import Ledger
from lane_plugin.reports import drift
from lane_plugin.testing.prefect_server import free_port, server_env, stop, wait_healthy

from ..tables import ARTICLE_SQL

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


CLIENT = textwrap.dedent(
    """
    import json, sys, time
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey, FlowRunFilter, FlowRunFilterId
    from prefect.deployments import run_deployment

    name = "drift-report/drift-report"
    with get_client(sync_client=True) as client:
        end = time.monotonic() + 90
        while True:  # the serving process registers the deployment when it starts
            try:
                client.read_deployment_by_name(name)
                break
            except Exception:
                if time.monotonic() > end:
                    raise
                time.sleep(1)
    run = run_deployment(name, parameters={"since": None, "plot": sys.argv[1]}, timeout=150)
    with get_client(sync_client=True) as client:
        arts = client.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["lane-drift", "lane-drift-summary"])),
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[run.id])),
        )
    print(json.dumps({"state": run.state.type.value, "message": run.state.message,
                      "artifacts": {a.key: a.data for a in arts}}))
    """
)


def test_drift_report_deployment_on_a_real_server(tmp_path):
    port = free_port()
    api = f"http://127.0.0.1:{port}/api"
    lane_url = f"sqlite:///{tmp_path / 'lane.db'}"
    env = server_env(
        tmp_path, api, PREFECT_RUNNER_POLL_FREQUENCY="2", PREFECT_LOGGING_LEVEL="INFO", LANE_DATABASE_URL=lane_url
    )

    # the ledger: one biased stage, one honest one
    rng = random.Random(11)
    led = Ledger(lane_url)
    led.set_lane("free", allowance=10**9, ceiling=10**9, burst_tokens=10**9, max_leased=10_000)
    for stage, bias in (("draft", 1.9), ("review", 1.0)):
        ids = [led.submit(stage, 1000 + rng.randrange(100), est_version="const-v1") for _ in range(50)]
        led.tick("free")
        for jid in ids:
            led.settle(jid, int(1000 * bias * rng.lognormvariate(0, 0.2)))
    expected = drift(led).set_index("stage")
    _, article = led.rows(ARTICLE_SQL)
    led.close()

    server_log, serve_log = tmp_path / "server.log", tmp_path / "serve.log"
    server = serve = None
    try:
        with server_log.open("w") as out:
            server = subprocess.Popen(
                [
                    str(BIN / "prefect"),
                    "server",
                    "start",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(port),
                    "--analytics-off",
                    "--no-ui",
                ],
                env=env,
                cwd=tmp_path,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        wait_healthy(api, server, server_log)
        with serve_log.open("w") as out:
            serve = subprocess.Popen(
                [sys.executable, "deployments/serve.py", "--only", "drift-report", "--no-schedule"],
                env=env,
                cwd=ROOT,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        client = subprocess.run(
            [sys.executable, "-c", CLIENT, str(tmp_path / "drift.png")],
            env=env,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=240,
        )
        logs = f"\nclient stderr:\n{client.stderr[-3000:]}\nserve log:\n{serve_log.read_text()[-3000:]}"
        assert client.returncode == 0, logs
        result = json.loads(client.stdout.strip().splitlines()[-1])
        assert result["state"] == "COMPLETED", (result, logs)

        table = {r["stage"]: r for r in json.loads(result["artifacts"]["lane-drift"])}
        assert set(table) == {"draft", "review"}
        for stage, jobs, est_tokens, actual_tokens, d in article:
            row = table[stage]
            assert (row["jobs"], row["est_tokens"], row["actual_tokens"], row["drift"]) == (
                jobs,
                est_tokens,
                actual_tokens,
                float(d),
            )
            assert (row["p50"], row["p90"], row["overage_tokens"]) == (
                expected.loc[stage, "p50"],
                expected.loc[stage, "p90"],
                expected.loc[stage, "overage_tokens"],
            )
        assert table["draft"]["drift"] > 1.5 and table["draft"]["verdict"].startswith("overspends")
        assert "**Worst overspender: draft" in result["artifacts"]["lane-drift-summary"]
        assert (tmp_path / "drift.png").stat().st_size > 5000
    finally:
        stop(serve)
        stop(server)
