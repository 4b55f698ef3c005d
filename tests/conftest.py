"""Shared fixtures: a ledger URL on SQLite and, when reachable, on PostgreSQL; one Prefect server.

``prefect_test_harness`` starts a server subprocess (~9 s): it is started once,
lazily, by the first test that asks for ``prefect_server``. The ``ledger``
fixture gives each Prefect test its own SQLite ledger through
``LANE_DATABASE_URL`` (the gate keeps one Ledger per URL).

PostgreSQL is read from LANE_TEST_POSTGRES_URL. Each test gets a private schema
(``search_path`` through the URL's ``options``), dropped afterwards. When the
server is unreachable the PostgreSQL half of a suite is skipped with the
reason, unless LANE_REQUIRE_POSTGRES=1 (CI), where that is a failure.
"""

from __future__ import annotations

import faulthandler
import hashlib
import os
import sys
import tempfile
import uuid
from pathlib import Path
from urllib.parse import quote

import pytest

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")

PG_ENV = "LANE_TEST_POSTGRES_URL"


class Clock:
    """An injected ledger clock a test moves by hand: ``Ledger(url, clock=clock); clock.t += 31``."""

    def __init__(self, t: float = 1_800_000_000.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def clock():
    return Clock()


def _pg_base() -> str | None:
    return os.environ.get(PG_ENV)


def _pg_connect_kwargs(url: str) -> dict:
    from lane_plugin.ledger.url import parse_url

    return dict(parse_url(url).conninfo)


def postgres_or_skip() -> str:
    base = _pg_base()
    required = os.environ.get("LANE_REQUIRE_POSTGRES") == "1"
    if not base:
        if required:
            pytest.fail(f"LANE_REQUIRE_POSTGRES=1 but {PG_ENV} is not set")
        pytest.skip(f"PostgreSQL tests need {PG_ENV} (e.g. postgresql+psycopg://root@127.0.0.1:5432/test)")
    import psycopg

    try:
        psycopg.connect(**_pg_connect_kwargs(base), connect_timeout=3).close()
    except psycopg.OperationalError as exc:
        if required:
            pytest.fail(f"PostgreSQL at {PG_ENV} unreachable: {exc}")
        pytest.skip(f"PostgreSQL at {PG_ENV} unreachable: {' '.join(str(exc).split())[:200]}")
    return base


class PgSchema:
    """A private schema on the test server, and a URL whose search_path points at it."""

    def __init__(self, base: str, prefix: str = "t"):
        import psycopg

        self.kwargs = _pg_connect_kwargs(base)
        self.name = f"{prefix}_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(**self.kwargs, autocommit=True) as conn:
            conn.execute(f'create schema "{self.name}"')
        sep = "&" if "?" in base else "?"
        # Named after the schema (a test naming its own application_name later in the URL overrides it), so that
        # drop() can end what the test left connected: a ledger a test never closed keeps its pool open while its
        # wake-up watcher lives, and one suite worker reached 48 connections (PostgreSQL allows 100). The search_path
        # stays last: tests read the schema from the URL's end.
        self.url = f"{base}{sep}application_name={self.name}&options={quote('-csearch_path=' + self.name)}"
        if os.environ.get("LANE_TEST_PG_MAP"):  # which test holds which schema, for a connection monitor
            with open(os.environ["LANE_TEST_PG_MAP"], "a") as f:
                f.write(f"{self.name} {os.environ.get('PYTEST_CURRENT_TEST', '?')}\n")

    def drop(self) -> None:
        import psycopg

        with psycopg.connect(**self.kwargs, autocommit=True) as conn:
            conn.execute(
                "select pg_terminate_backend(pid) from pg_stat_activity where application_name = %s", (self.name,)
            )
            conn.execute(f'drop schema if exists "{self.name}" cascade')


@pytest.fixture
def pg_url():
    schema = PgSchema(postgres_or_skip())
    yield schema.url
    schema.drop()


@pytest.fixture
def sqlite_url(tmp_path):
    return f"sqlite:///{tmp_path / 'lane.db'}"


@pytest.fixture(params=["sqlite", "postgresql"])
def ledger_url(request, tmp_path):
    """The same store suite runs on both databases."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'lane.db'}"
        return
    schema = PgSchema(postgres_or_skip())
    yield schema.url
    schema.drop()


# -- the long files first (issue 25 item 5) -------------------------------------------------------------
# ``--dist loadfile`` gives each worker a whole file, in the order of the collection (``--no-loadscope-reorder``
# in pyproject.toml: xdist's own order, most tests first, put the one- and two-test files of minutes last, one
# worker busy with them while the other had nothing left). These files took a minute or more each on main's
# last full run (2 cores, load about 10; seconds summed from ``--durations``), longest first; every other file
# keeps its place behind them.
LONG_FILES = (
    "tests/faults/test_model.py",  # 390 s (200 SQLite programs then; 100 now)
    "tests/gating/test_lifecycle_hostile.py",  # 255 s in issue 25's run (50 Prefect flows, real timeouts)
    "tests/faults/test_contention.py",  # 155 s
    "tests/faults/test_dask.py",  # 130 s
    "tests/faults/test_hostile.py",  # 120 s
    "tests/cli/test_traps.py",  # about 120 s (20 tests of `lane` subprocesses)
    "tests/docs/test_getting_started.py",  # 100 s
    "tests/faults/test_prefect_machines.py",  # 80 s
    "tests/faults/test_sigterm.py",  # about 80 s (stuck workers waiting out their grace, a Prefect flow run)
    "tests/faults/test_tenant_ceiling.py",  # about 45 s (8 processes, kill -9, both databases)
    "tests/faults/test_async_exc.py",  # about 110 s at load 10 (30 points a leg, four legs, the pool test)
    "tests/gating/test_nested_timeout.py",  # about 55 s (timeout_test_flow x10 on SQLite and on PostgreSQL)
    "tests/faults/test_timeout_storm.py",  # about 45 s (120 Prefect runs with timeouts, on both databases)
    "tests/e2e/test_ui.py",  # 78 s
    "tests/e2e/test_real_server.py",  # 75 s
    "tests/cli/test_estimators_cli.py",  # 75 s
    "tests/faults/test_delivery.py",  # 67 s
    "tests/cli/test_first_hour.py",  # about 60 s
    "tests/cli/test_cli.py",  # about 60 s
)


# -- a hang ends its worker, and says where it hung -----------------------------------------------
# Under xdist the dump comes a second before pytest-timeout's (whose own dump a worker's output loses): both end
# the worker, this one leaves the stacks where the re-run shows them. Without xdist it is a backstop, later.
BACKSTOP_XDIST = -1.0  # seconds past a test's own timeout, in an xdist worker
BACKSTOP_GRACE = 120.0  # the same, in a plain run (pytest-timeout reports the test itself)


def _running_marker(item) -> Path | None:
    """A file naming the test an xdist worker runs now (and that worker), left behind if it dies on it."""
    workerinput = getattr(item.config, "workerinput", None)
    if workerinput is None:
        return None
    folder = Path(tempfile.gettempdir()) / f"lane-tests-running-{workerinput['testrunuid']}"
    folder.mkdir(exist_ok=True)
    return folder / hashlib.sha1(item.nodeid.encode()).hexdigest()


_STACKS: dict[str, object] = {}  # this worker's file for the backstop's stack dump, opened once


def _stacks_file(marker: Path | None):
    if marker is None:
        return sys.__stderr__
    path = marker.parent / f"stacks-{os.getpid()}.txt"
    if str(path) not in _STACKS:
        _STACKS[str(path)] = open(path, "w")  # noqa: SIM115 (kept open: faulthandler writes to it from C)
    return _STACKS[str(path)]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """At its timeout (:data:`BACKSTOP_XDIST`, :data:`BACKSTOP_GRACE`), a test's process dumps every thread's stack
    and exits.

    pytest-timeout's thread starts with ``threading``, which a lock left held by an interrupted thread
    (the defect class this project tests for) can stop; faulthandler's watchdog is C, outside the
    interpreter's locks. Under xdist the worker's exit fails that test by name and a new worker takes the
    rest of its file. xdist hands the new worker the dead test again: it fails at once the second time
    (:func:`pytest_runtest_setup`) with the stacks the dead worker dumped, so a hang costs its test and
    shows where it hung, never the whole CI run.
    """
    mark = item.get_closest_marker("timeout")
    limit = mark.args[0] if mark and mark.args else (mark.kwargs.get("timeout") if mark else None)
    if limit is None:
        try:
            limit = item.config.getini("timeout")
        except ValueError:  # pytest-timeout not loaded
            limit = None
    marker = _running_marker(item)
    died_before = marker is not None and marker.exists()
    item.stash[_DIED_ON_BEFORE] = marker.read_text() if died_before else None
    stacks = _stacks_file(marker)
    if marker is not None and not died_before:
        marker.write_text(getattr(stacks, "name", ""))
    past = BACKSTOP_XDIST if marker is not None else BACKSTOP_GRACE
    faulthandler.dump_traceback_later(max(1.0, float(limit or 900) + past), exit=True, file=stacks)
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()
        if marker is not None and not died_before:
            marker.unlink(missing_ok=True)


_DIED_ON_BEFORE = pytest.StashKey[str | None]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    """A test that leaves this process's main thread marked stopped fails, by name, and the mark is undone.

    An exception raised into a thread while it runs ``Thread.is_alive()`` of the main thread (a fault test's
    injection, at a line of threading.py) makes CPython release the main thread's state lock and mark it stopped
    (bpo-45274's handling). Every later test of the worker then met it: Prefect's shield lookup for the main thread
    raised KeyError (56 failures in one CI run, none of them the cause)."""
    import threading

    result = yield
    main = threading.main_thread()
    if threading.current_thread() is main and not main.is_alive():
        import _thread

        lock = _thread.allocate_lock()
        lock.acquire()  # held, as a live thread's state lock is
        main._tstate_lock, main._is_stopped = lock, False  # type: ignore[attr-defined]
        pytest.fail("this test left the main thread marked stopped (an exception raised into Thread.is_alive())")
    return result


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    stacks_path = item.stash.get(_DIED_ON_BEFORE, None)
    if stacks_path is not None:
        try:
            stacks = Path(stacks_path).read_text() or "(no stacks dumped: the worker crashed)"
        except OSError:
            stacks = "(no stacks file)"
        pytest.fail(
            f"a test worker died on this test before (a crash, or its timeout); not run twice. "
            f"What its threads were doing:\n{stacks}",
            pytrace=False,
        )


def pytest_collection_modifyitems(config, items):
    rank = {path: i for i, path in enumerate(LONG_FILES)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(rank)))  # stable: a file stays whole


# -- no migration lock left behind (issue 25) ----------------------------------------------------
@pytest.fixture(scope="session", autouse=True)
def no_migration_lock_left_behind(tmp_path_factory):
    """At the end of the session (of each xdist worker): the SQLite ledgers this session made (under its
    temporary base and PREFECT_HOME) left no ``*.migrate.lock`` beside them, and none in the system
    temporary directory under the name they had there before issue 25 (``lane-ledger-<sha256 of the
    ledger's path>.migrate.lock``). Checking by those names, not by listing the directory, keeps other
    suites running on this machine from failing this one."""
    yield
    roots = [tmp_path_factory.getbasetemp()]
    if os.environ.get("PREFECT_HOME"):
        roots.append(Path(os.environ["PREFECT_HOME"]))
    left = [str(p) for root in roots if root.is_dir() for p in root.rglob("*.migrate.lock")]
    ledgers = [p for root in roots if root.is_dir() for p in root.rglob("*.db")]
    temp = Path(tempfile.gettempdir())
    for ledger in ledgers:
        digest = hashlib.sha256(os.path.realpath(ledger).encode()).hexdigest()[:24]
        old = temp / f"lane-ledger-{digest}.migrate.lock"
        if old.exists():
            left.append(f"{old} (for {ledger})")
    assert not left, f"{len(ledgers)} ledgers left migration locks behind:\n" + "\n".join(left[:20])


# -- Prefect: one test server for the whole session (~9 s to start), a fresh ledger per test ---------
@pytest.fixture(scope="session")
def prefect_server():
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield


@pytest.fixture
def ledger(tmp_path, monkeypatch):
    """The ledger the gate uses in this test (a fresh SQLite file); audited afterwards."""
    from lane_plugin.gating import get_ledger

    url = f"sqlite:///{tmp_path / 'lane.db'}"
    monkeypatch.setenv("LANE_DATABASE_URL", url)
    led = get_ledger(url)
    yield led
    led.close()
