"""lane_plugin.testing.prefect_server: the real Prefect server helper the e2e tests and bench_tenants share."""

from __future__ import annotations

import subprocess
import sys

import pytest

from lane_plugin.testing.prefect_server import ServerNotHealthy, free_port, server_env, wait_healthy


def test_a_server_that_exits_is_reported_with_its_exit_code_and_its_log(tmp_path):
    log = tmp_path / "server.log"
    with log.open("w") as out:
        proc = subprocess.Popen([sys.executable, "-c", "print('port in use'); raise SystemExit(3)"], stdout=out)
    proc.wait(30)
    assert proc.returncode == 3  # the fault happened: the "server" is gone before the health check
    with pytest.raises(ServerNotHealthy, match=r"exited with 3:\n(.|\n)*port in use"):
        wait_healthy(f"http://127.0.0.1:{free_port()}/api", proc, log, timeout=5)


def test_a_server_that_never_answers_is_reported_after_the_timeout(tmp_path):
    log = tmp_path / "server.log"
    log.write_text("still starting\n")
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        with pytest.raises(ServerNotHealthy, match=r"not healthy after 1(\.0)?s:\nstill starting"):
            wait_healthy(f"http://127.0.0.1:{free_port()}/api", proc, log, timeout=1)
    finally:
        proc.kill()
        proc.wait()


def test_the_environment_points_every_process_at_this_server_alone(tmp_path, monkeypatch):
    monkeypatch.setenv("PREFECT_API_KEY", "a-cloud-key")
    env = server_env(tmp_path, "http://127.0.0.1:1/api", EXTRA="1")
    assert env["PREFECT_API_URL"] == "http://127.0.0.1:1/api" and "PREFECT_API_KEY" not in env
    assert env["PREFECT_HOME"] == str(tmp_path / "prefect-home") and env["EXTRA"] == "1"
    assert env["PREFECT_API_DATABASE_CONNECTION_URL"].endswith(str(tmp_path / "prefect.db"))
