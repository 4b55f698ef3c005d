"""Run Prefect's own task tests with every ``@task`` swapped for ``lane_task`` (issue 15).

This file is lane_plugin's (the tests under ``tests/`` beside it are Prefect's, vendored; see
README.md). It is loaded before Prefect's conftest and before any test module, and

1. sets what Prefect's pytest-env list sets (``PREFECT_TESTING_*``), before Prefect is imported,
   and puts this interpreter's ``bin`` first on PATH (Prefect's API server fixture runs ``uvicorn``);
2. gives this pytest process (or xdist worker) a fresh SQLite ledger through ``LANE_DATABASE_URL``,
   with lane ``free`` made large enough that admission never waits;
3. replaces ``prefect.task`` / ``prefect.tasks.task`` with :func:`swapped_task`, which accepts
   ``@task``, ``@task(...)`` and ``task(fn, **options)`` like Prefect's and builds
   ``lane_task(stage=<function name>, estimate=1, lane="free", **options)(fn)``; test modules
   import ``task`` after this, so every task they define is a lane task. Tests that build
   ``Task(fn=...)`` directly keep a plain Prefect task;
4. marks the tests listed in ``tests/gating/test_prefect_suite.py`` (``TAG_ASSERTIONS``) as strict
   expected failures, with their reason: they assert a task's exact tags, and a lane task carries
   ``lane:<lane>`` and ``stage:<stage>`` by default. ``LANE_SUITE_LANE_TAGS=0`` swaps with
   ``lane_tags=False`` instead, and then nothing is expected to fail;
5. replaces Prefect's ``hosted_api_server`` session fixture (before Prefect's conftest star-imports it) with
   :func:`hosted_api_server`: Prefect's gives its uvicorn 20 s to answer, and when it does not (its start
   takes longer on a loaded machine) raises inside ``open_process``, whose ``async with process`` then waits
   for the server to exit before its ``finally`` terminates it: the session hangs for ever.
"""

from __future__ import annotations

import importlib.util
import inspect
import os
import sys
import tempfile
from pathlib import Path

import pytest

for _key, _value in {
    "PREFECT_TESTING_TEST_MODE": "1",
    "PREFECT_TESTING_UNIT_TEST_MODE": "1",
    "PREFECT_SERVER_LOGGING_LEVEL": "DEBUG",
}.items():
    os.environ[_key] = _value
# Prefect's hosted_api_server fixture starts `uvicorn`: the one beside this interpreter.
os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"

import anyio  # noqa: E402
import httpx  # noqa: E402
import prefect  # noqa: E402
import prefect.tasks  # noqa: E402
import prefect.testing.fixtures  # noqa: E402
from prefect.settings import get_current_settings  # noqa: E402
from prefect.utilities.processutils import open_process  # noqa: E402

import lane_plugin.gating.task  # noqa: E402,F401  (imported before any test: Prefect's reset_sys_modules keeps it)
from lane_plugin import Ledger, lane_task  # noqa: E402

HERE = Path(__file__).resolve().parent
LANE_TAGS = os.environ.get("LANE_SUITE_LANE_TAGS", "1") != "0"
FALLBACK_STAGE = "swapped"  # the stage of a callable without a __name__ (a partial, a callable object)
ORIGINAL_TASK = prefect.tasks.task


def _expected_failures() -> dict[str, str]:
    spec = importlib.util.spec_from_file_location("lane_prefect_suite_expected", HERE.parent / "test_prefect_suite.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.TAG_ASSERTIONS


def _fresh_ledger() -> str:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    base = Path(os.environ.get("LANE_SWAP_DB_DIR") or tempfile.mkdtemp(prefix="lane_suite_"))
    base.mkdir(parents=True, exist_ok=True)
    url = f"sqlite:///{base / f'lane-{worker}-{os.getpid()}.db'}"
    os.environ["LANE_DATABASE_URL"] = url
    led = Ledger(url)
    led.set_lane("free", allowance=10**12, ceiling=10**12, burst_tokens=10**12, max_leased=10**6)
    led.close()
    return url


def swapped_task(__fn=None, /, **options):
    """``prefect.task``'s call forms, built by ``lane_task``."""

    def build(fn):
        stage = getattr(fn, "__name__", None)
        if not isinstance(stage, str) or not stage.strip():
            stage = FALLBACK_STAGE
        return lane_task(stage=stage, estimate=1, lane="free", lane_tags=LANE_TAGS, **options)(fn)

    return build if __fn is None else build(__fn)


# Tests that inspect the decorator itself (test_with_options_signature_aligns_with_task_signature)
# compare its parameters with Task.with_options': the stand-in shows prefect.task's signature.
swapped_task.__signature__ = inspect.signature(ORIGINAL_TASK)
LEDGER_URL = _fresh_ledger()
prefect.tasks.task = swapped_task
prefect.task = swapped_task


SERVER_START_SECONDS = float(os.environ.get("LANE_SUITE_SERVER_START_SECONDS", "120"))


@pytest.fixture(scope="session")
async def hosted_api_server(unused_tcp_port_factory, test_database_connection_url):
    """Prefect's ``hosted_api_server`` (prefect.testing.fixtures), with two changes: the server has
    ``LANE_SUITE_SERVER_START_SECONDS`` (default 120) to answer its health check, not 20, and a server that
    never answers is terminated before ``open_process`` is left (Prefect's waits for it to exit first)."""
    _ = test_database_connection_url  # the per-worker database URL is applied before the server starts
    port = unused_tcp_port_factory()
    settings = get_current_settings().to_environment_variables(exclude_unset=True)
    command = ["uvicorn", "--factory", "prefect.server.api.server:create_app", "--host", "127.0.0.1"]
    command += ["--port", str(port), "--log-level", "info"]
    env = {**os.environ, **settings}
    async with open_process(command=command, stdout=sys.stdout, stderr=sys.stderr, env=env) as process:
        api_url = f"http://localhost:{port}/api"
        try:
            healthy = False
            async with httpx.AsyncClient() as client:
                with anyio.move_on_after(SERVER_START_SECONDS):
                    while not healthy:
                        try:
                            healthy = (await client.get(api_url + "/health")).status_code == 200
                        except httpx.ConnectError:
                            pass
                        if not healthy:
                            await anyio.sleep(0.1)
            if not healthy:
                raise RuntimeError(f"the hosted test Prefect API did not answer within {SERVER_START_SECONDS:g} s")
        except BaseException:
            await _stop(process)
            raise
        yield api_url
        await _stop(process)


async def _stop(process) -> None:
    """SIGTERM, then SIGKILL after 10 s, as Prefect's fixture stops its server."""
    try:
        process.terminate()
        with anyio.move_on_after(10):
            await process.wait()
        if process.returncode is None:
            process.kill()
    except ProcessLookupError:
        pass


prefect.testing.fixtures.hosted_api_server = hosted_api_server  # what Prefect's conftest star-imports


def pytest_collection_modifyitems(session, config, items):
    expected = _expected_failures() if LANE_TAGS else {}
    for item in items:
        module = getattr(item, "module", None)
        if module is not None and getattr(module, "task", None) is ORIGINAL_TASK:
            module.task = swapped_task
        reason = expected.get(item.nodeid)
        if reason is not None:
            item.add_marker(pytest.mark.xfail(reason=reason, strict=True))


def pytest_report_header(config):
    return [
        f"lane_plugin: @task -> lane_task(stage=<fn name>, estimate=1, lane='free', lane_tags={LANE_TAGS}); "
        f"ledger {LEDGER_URL}"
    ]
