# Trimmed from https://github.com/PrefectHQ/prefect, tests/conftest.py and tests/fixtures/{database,
# client,events,logging,storage,time,collections_registry}.py at tag 3.8.4.dev6, commit
# ce79dd3d6cfa2b7337265498210dbc4d25bcdc98.
# Copyright 2019- Prefect Technologies, Inc. Licensed under the Apache License, Version 2.0
# (http://www.apache.org/licenses/LICENSE-2.0; a copy is LICENSE-prefect beside this folder).
#
# Kept: only the hooks and fixtures tests/test_tasks.py and tests/test_task_engine.py use (found with
# `pytest --fixtures-per-test`), each doing what Prefect's does (long docstrings and comments
# shortened). Changed, and why:
# - SQLite only: the PostgreSQL branch of generate_test_database_connection_url is left out (no asyncpg);
# - no service-selection options (--exclude-services etc.): these two files mark no service;
# - `worker_id` falls back to "master" when pytest-xdist is not installed (xdist provides it);
# - the numpy pre-import (an xdist fork workaround for fakeredis, which these tests do not use) is gone;
# - clear_db does not retry on connection errors (SQLite) and has no --no-clear-db option.
"""Base configuration of pytest for Prefect's task tests (trimmed; see the header)."""

import asyncio
import datetime
import gc
import importlib.util
import logging
import shutil
import sys
import tempfile
from pathlib import Path
from typing import AsyncGenerator, Generator, Optional
from urllib.parse import urlsplit

import pytest
from pytest_asyncio import is_async_test

pytest.register_assert_rewrite("prefect.testing.utilities")

import prefect  # noqa: E402
from prefect.blocks.core import Block  # noqa: E402
from prefect.client.orchestration import PrefectClient, SyncPrefectClient, get_client  # noqa: E402
from prefect.events.worker import EventsWorker  # noqa: E402
from prefect.logging.configuration import setup_logging  # noqa: E402
from prefect.logging.handlers import APILogHandler, APILogWorker  # noqa: E402
from prefect.server.api import collections  # noqa: E402
from prefect.server.concurrency.lease_storage.memory import ConcurrencyLeaseStorage  # noqa: E402
from prefect.server.database import PrefectDBInterface, orm_models, provide_database_interface  # noqa: E402
from prefect.server.database.configurations import ENGINES, TRACKER  # noqa: E402
from prefect.server.events.clients import AssertingEventsClient  # noqa: E402
from prefect.server.models.concurrency_limits_v2 import create_concurrency_limit  # noqa: E402
from prefect.server.schemas.core import ConcurrencyLimitV2  # noqa: E402
from prefect.settings import (  # noqa: E402
    PREFECT_API_BLOCKS_REGISTER_ON_START,
    PREFECT_API_LOG_RETRYABLE_ERRORS,
    PREFECT_API_SERVICES_CANCELLATION_CLEANUP_ENABLED,
    PREFECT_API_SERVICES_EVENT_PERSISTER_ENABLED,
    PREFECT_API_SERVICES_FOREMAN_ENABLED,
    PREFECT_API_SERVICES_LATE_RUNS_ENABLED,
    PREFECT_API_SERVICES_PAUSE_EXPIRATIONS_ENABLED,
    PREFECT_API_SERVICES_SCHEDULER_ENABLED,
    PREFECT_API_SERVICES_TASK_RUN_RECORDER_ENABLED,
    PREFECT_API_SERVICES_TRIGGERS_ENABLED,
    PREFECT_API_URL,
    PREFECT_CLI_COLORS,
    PREFECT_CLI_WRAP_LINES,
    PREFECT_FLOWS_HEARTBEAT_FREQUENCY,
    PREFECT_HOME,
    PREFECT_LOCAL_STORAGE_PATH,
    PREFECT_LOGGING_INTERNAL_LEVEL,
    PREFECT_LOGGING_LEVEL,
    PREFECT_LOGGING_TO_API_ENABLED,
    PREFECT_MEMOIZE_BLOCK_AUTO_REGISTRATION,
    PREFECT_PROFILES_PATH,
    PREFECT_SERVER_ANALYTICS_ENABLED,
    PREFECT_SERVER_CSRF_PROTECTION_ENABLED,
    PREFECT_SERVER_DATABASE_CONNECTION_URL,
    PREFECT_SERVER_LOGGING_LEVEL,
    PREFECT_UNIT_TEST_LOOP_DEBUG,
    temporary_settings,
)
from prefect.utilities.dispatch import get_registry_for_type  # noqa: E402

# isort: split
from prefect.testing.fixtures import *  # noqa: E402,F401,F403  (hosted_api_server, events_pipeline, ...)


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]):
    # Ensure that all async tests are run with the session loop scope
    session_scope_marker = pytest.mark.asyncio(loop_scope="session")
    for async_test in [item for item in items if is_async_test(item)]:
        async_test.add_marker(session_scope_marker, append=False)
    if sys.platform != "win32":
        for item in items:
            if item.get_closest_marker("windows"):
                item.add_marker(pytest.mark.skip(reason="Test only runs on Windows"))


if importlib.util.find_spec("xdist") is None:

    @pytest.fixture(scope="session")
    def worker_id() -> str:
        return "master"


@pytest.fixture(scope="session", autouse=True)
async def setup_loop_debugging():
    loop = asyncio.get_event_loop()
    asyncio_logger = logging.getLogger("asyncio")
    asyncio_logger.setLevel("WARNING")
    asyncio_logger.addHandler(logging.StreamHandler())
    loop.slow_callback_duration = 0.25
    if PREFECT_UNIT_TEST_LOOP_DEBUG:
        loop.set_debug(True)


@pytest.fixture(scope="function", autouse=True)
async def restore_loop_after_each_test():
    loop = asyncio.get_event_loop()
    yield
    asyncio.set_event_loop(loop)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item):
    yield
    assert_lifespan_is_not_left_open()


def assert_lifespan_is_not_left_open():
    # As in Prefect's conftest, this is a generator function (note the yield), so the call above
    # runs none of it; prefect.client has no APP_LIFESPANS any more. Kept as Prefect has it.
    from prefect.client import APP_LIFESPANS

    yield

    open_lifespans = APP_LIFESPANS.copy()
    if open_lifespans:
        APP_LIFESPANS.clear()
        raise RuntimeError(
            "Lifespans should be cleared at the end of each test, but "
            f"{len(open_lifespans)} lifespans were not closed: {open_lifespans!r}"
        )


TEST_PREFECT_HOME = None
TEST_PROFILE_CTX = None


def pytest_sessionstart(session: pytest.Session):
    """A profile for the session: a temporary PREFECT_HOME, no API, services off (as Prefect's)."""
    global TEST_PREFECT_HOME, TEST_PROFILE_CTX

    TEST_PREFECT_HOME = tempfile.mkdtemp()
    profile = prefect.settings.Profile(
        name="test-session",
        settings={
            PREFECT_HOME: TEST_PREFECT_HOME,
            PREFECT_LOCAL_STORAGE_PATH: Path(TEST_PREFECT_HOME) / "storage",
            PREFECT_PROFILES_PATH: "$PREFECT_HOME/profiles.toml",
            PREFECT_API_URL: None,
            PREFECT_CLI_COLORS: False,
            PREFECT_CLI_WRAP_LINES: False,
            PREFECT_LOGGING_LEVEL: "DEBUG",
            PREFECT_LOGGING_INTERNAL_LEVEL: "DEBUG",
            PREFECT_SERVER_LOGGING_LEVEL: "DEBUG",
            PREFECT_LOGGING_TO_API_ENABLED: False,
            PREFECT_SERVER_ANALYTICS_ENABLED: False,
            PREFECT_API_SERVICES_LATE_RUNS_ENABLED: False,
            PREFECT_API_SERVICES_SCHEDULER_ENABLED: False,
            PREFECT_API_SERVICES_PAUSE_EXPIRATIONS_ENABLED: False,
            PREFECT_API_SERVICES_CANCELLATION_CLEANUP_ENABLED: False,
            PREFECT_API_SERVICES_FOREMAN_ENABLED: False,
            PREFECT_API_LOG_RETRYABLE_ERRORS: True,
            PREFECT_MEMOIZE_BLOCK_AUTO_REGISTRATION: False,
            PREFECT_API_BLOCKS_REGISTER_ON_START: False,
            PREFECT_API_SERVICES_EVENT_PERSISTER_ENABLED: False,
            PREFECT_API_SERVICES_TRIGGERS_ENABLED: False,
            PREFECT_API_SERVICES_TASK_RUN_RECORDER_ENABLED: False,
            PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None,
        },
        source=__file__,
    )
    TEST_PROFILE_CTX = prefect.context.use_profile(
        profile, override_environment_variables=True, include_current_context=False
    )
    TEST_PROFILE_CTX.__enter__()
    PREFECT_LOCAL_STORAGE_PATH.value().mkdir()
    setup_logging()


@pytest.fixture(scope="session", autouse=True)
def cleanup(drain_log_workers: None, drain_events_workers: None):
    yield
    if TEST_PREFECT_HOME is not None:
        shutil.rmtree(TEST_PREFECT_HOME, ignore_errors=True)


@pytest.fixture(scope="session", autouse=True)
def safety_check_settings():
    assert PREFECT_API_URL.value() is None, "Tests should not be run connected to an external API."
    assert str(PREFECT_HOME.value()) == TEST_PREFECT_HOME, "Tests should use the temporary test directory"


@pytest.fixture(scope="session", autouse=True)
async def generate_test_database_connection_url(worker_id: str) -> AsyncGenerator[Optional[str], None]:
    """SQLite only here: one database file per test worker inside the temporary PREFECT_HOME."""
    original_url = PREFECT_SERVER_DATABASE_CONNECTION_URL.value()
    if not original_url:
        yield None
        return
    scheme = urlsplit(original_url).scheme
    if scheme != "sqlite+aiosqlite":
        raise ValueError(f"this trimmed conftest runs on SQLite only, not {scheme!r}")
    yield f"sqlite+aiosqlite:///{Path(PREFECT_HOME.value()) / f'prefect_{worker_id}.db'}"


@pytest.fixture(scope="session", autouse=True)
def test_database_connection_url(
    generate_test_database_connection_url: Optional[str],
) -> Generator[Optional[str], None, None]:
    url = generate_test_database_connection_url
    if url is None:
        yield None
    else:
        with temporary_settings(updates={PREFECT_SERVER_DATABASE_CONNECTION_URL: url}):
            yield url


@pytest.fixture(autouse=True)
def reset_registered_blocks():
    registry = get_registry_for_type(Block)
    before = registry.copy()
    yield
    registry.clear()
    registry.update(before)


@pytest.fixture
def caplog(caplog: pytest.LogCaptureFixture) -> Generator[pytest.LogCaptureFixture, None, None]:
    """Overrides caplog to apply to all of our loggers that do not propagate."""
    from prefect.logging.configuration import PROCESS_LOGGING_CONFIG

    for name, logger_config in PROCESS_LOGGING_CONFIG["loggers"].items():
        if not logger_config.get("propagate", True):
            logger = logging.getLogger(name)
            if caplog.handler not in logger.handlers:
                logger.handlers.append(caplog.handler)
    yield caplog


@pytest.fixture(autouse=True)
def disable_csrf_protection():
    with temporary_settings({PREFECT_SERVER_CSRF_PROTECTION_ENABLED: False}):
        yield


@pytest.fixture(autouse=True)
def reset_sys_modules():
    import importlib

    original_modules = sys.modules.copy()
    if sys.platform == "linux" and "." in sys.path:
        sys.path.remove(".")
    yield

    def _should_preserve(module: str) -> bool:
        return module.startswith("prefect.cli.") or module == "cyclopts" or module.startswith("cyclopts.")

    for module in set(sys.modules.keys()):
        if module not in original_modules and not _should_preserve(module):
            parts = module.rsplit(".", 1)
            if len(parts) == 2:
                parent = sys.modules.get(parts[0])
                if parent is not None:
                    try:
                        delattr(parent, parts[1])
                    except AttributeError:
                        pass
            del sys.modules[module]
    importlib.invalidate_caches()


@pytest.fixture(autouse=True, scope="module")
def leaves_no_extraneous_files():
    before = set(Path(".").iterdir())
    yield
    new_files = {f for f in set(Path(".").iterdir()) - before if not f.name.startswith(".coverage")}
    if new_files:
        raise AssertionError(f"One of the tests in this module left new files in the working directory: {new_files}")


# -- tests/fixtures/database.py ---------------------------------------------------------------------
@pytest.fixture(scope="session", autouse=True)
def db(test_database_connection_url, safety_check_settings):
    return provide_database_interface()


@pytest.fixture(scope="session", autouse=True)
async def database_engine(db: PrefectDBInterface):
    TRACKER.active = True
    engine = await db.engine()
    yield engine
    engines = list(ENGINES.values())
    ENGINES.clear()
    for engine in engines:
        await engine.dispose()
    TRACKER.clear()
    gc.collect()


@pytest.fixture(scope="session", autouse=True)
async def setup_db(database_engine, db):
    try:
        await db.create_db()
        yield
    except Exception as exc:
        raise RuntimeError(f"Failed to set up the database at {database_engine.url!r}") from exc


@pytest.fixture(autouse=True)
async def clear_db(db, request):
    if "clear_db" in request.keywords:
        async with db.session_context(begin_transaction=True) as session:
            await session.execute(orm_models.Agent.__table__.delete())
            await session.execute(orm_models.WorkPool.__table__.delete())
            for table in reversed(orm_models.Base.metadata.sorted_tables):
                await session.execute(table.delete())
    storage = ConcurrencyLeaseStorage()
    storage.leases.clear()
    storage.expirations.clear()
    yield


@pytest.fixture
async def session(db):
    session = await db.session()
    async with session:
        yield session


@pytest.fixture
async def concurrency_limit_v2(session) -> ConcurrencyLimitV2:
    import uuid

    concurrency_limit = await create_concurrency_limit(
        session=session, concurrency_limit=ConcurrencyLimitV2(name=f"my-limit-{uuid.uuid4()}", limit=42)
    )
    await session.commit()
    return ConcurrencyLimitV2.model_validate(concurrency_limit, from_attributes=True)


# -- tests/fixtures/client.py -----------------------------------------------------------------------
@pytest.fixture
async def prefect_client(test_database_connection_url: str) -> AsyncGenerator[PrefectClient, None]:
    async with get_client() as client:
        yield client


@pytest.fixture
def sync_prefect_client(test_database_connection_url: str) -> Generator[SyncPrefectClient, None, None]:
    yield get_client(sync_client=True)


# -- tests/fixtures/events.py -----------------------------------------------------------------------
@pytest.fixture
def clean_asserting_events_client():
    AssertingEventsClient.last = None
    AssertingEventsClient.all.clear()


@pytest.fixture(autouse=True)
def workspace_events_client(clean_asserting_events_client: None, monkeypatch: pytest.MonkeyPatch) -> None:
    for where in (
        "prefect.server.events.clients",
        "prefect.server.events.actions",
        "prefect.server.orchestration.instrumentation_policies",
        "prefect.server.models.deployments",
    ):
        monkeypatch.setattr(f"{where}.PrefectServerEventsClient", AssertingEventsClient)


@pytest.fixture(scope="session", autouse=True)
async def drain_events_workers():
    yield
    await EventsWorker.drain_all()


# -- tests/fixtures/logging.py ----------------------------------------------------------------------
@pytest.fixture(autouse=True)
async def reset_api_log_handler():
    yield
    await APILogHandler.aflush()
    APILogHandler.workers = {}


@pytest.fixture(autouse=True)
def enable_api_log_handler_if_marked(request):
    if request.node.get_closest_marker("enable_api_log_handler") is not None:
        with temporary_settings(updates={PREFECT_LOGGING_TO_API_ENABLED: True}):
            yield True
    else:
        yield False


@pytest.fixture(scope="session", autouse=True)
async def drain_log_workers():
    yield
    await APILogWorker.drain_all()


# -- tests/fixtures/storage.py, collections_registry.py, time.py --------------------------------------
@pytest.fixture(autouse=True)
async def clear_cached_filesystems():
    prefect.results._default_storages.clear()
    yield
    prefect.results._default_storages.clear()


@pytest.fixture(autouse=True)
def cleared_collection_registry_cache():
    collections.GLOBAL_COLLECTIONS_VIEW_CACHE.clear()
    yield
    collections.GLOBAL_COLLECTIONS_VIEW_CACHE.clear()


@pytest.fixture
def advance_time(monkeypatch: pytest.MonkeyPatch):
    import prefect.types._datetime
    from zoneinfo import ZoneInfo

    clock = prefect.types._datetime.now("UTC")

    def advance(amount: datetime.timedelta):
        nonlocal clock
        clock += amount
        return clock

    def nowish(tz=None):
        advance(datetime.timedelta(microseconds=1))
        return clock if tz is None else clock.astimezone(ZoneInfo(getattr(tz, "name", tz)))

    monkeypatch.setattr(prefect.types._datetime, "now", nowish)
    return advance
