"""Issue 10 items 7 and 8: passwords never printed, and one URL parser for connecting and migrating.

Item 7, before the fix: a ``/`` in the password printed the whole URL, a ``#`` put a piece of it in
the parser's message, a space or a tab stopped the masking, ``?sslpassword=`` was printed, and
``lane simulate --from-ledger`` printed the raw URL in its output and its errors.
Item 8, before the fix: a password with ``@`` connected, but the migration resolved the host
``pw@127.0.0.1`` (and retried for a minute); ``sqlite:///a%20b.db`` migrated ``a b.db`` but
opened ``a%20b.db``.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import time
import uuid
from pathlib import Path
from urllib.parse import quote

import pytest

from lane_plugin import LaneError, Ledger

from ..lane_process import run_lane
from .conftest import PG_BASE, late_figure, pg_admin

HEAD, TAIL = "Zt0pSecr", "Kw8ndHalf"  # the two halves of every password: neither may be printed
SEPARATORS = {"slash": "/", "hash": "#", "space": " ", "tab": "\t", "at": "@", "question": "?", "colon": ":"}
LEAKS: dict = {"checked": 0, "surfaces": set(), "seps": set()}


def _lane(*args, timeout: float = 120) -> subprocess.CompletedProcess:
    return run_lane(list(args), env=dict(os.environ), timeout=timeout)


def _assert_hidden(text: str, where: str) -> None:
    LEAKS["checked"] += 1
    LEAKS["surfaces"].add(where.split(" ")[0])
    LEAKS["seps"].add(where.split(" ")[-1])
    for half in (HEAD, TAIL):
        assert half not in text, f"{where} printed the password ({half!r}): {text[-800:]!r}"


def _pg_base_url(user_info: str, port: int | None = None, query: str = "") -> str:
    host = PG_BASE.split("@", 1)[1].split("?", 1)[0]  # 127.0.0.1:5432/test
    if port is not None:
        host = host.replace(":5432/", f":{port}/")
    return f"postgresql+psycopg://{user_info}@{host}{query}"


@pytest.mark.parametrize("sep", sorted(SEPARATORS))
def test_unreachable_url_never_prints_the_password(sep):
    password = HEAD + SEPARATORS[sep] + TAIL
    userinfo = _pg_base_url(f"u:{password}", port=1)
    for url in (
        userinfo,
        _pg_base_url("u", port=1, query=f"?sslpassword={password}"),
        _pg_base_url("u", port=1, query=f"?password={quote(password)}&connect_timeout=2"),
    ):
        try:
            led = Ledger(url, retry_for=0.5)
            _assert_hidden(repr(led) + str(led.url) + repr(led.url), f"api repr {sep}")
            led.lanes()
            raise AssertionError(f"{sep}: connected to port 1")
        except LaneError as exc:
            _assert_hidden(str(exc) + repr(exc), f"api error {sep}")
        for args in (["lanes"], ["db", "upgrade"]) if url == userinfo else (["lanes"],):
            r = _lane("--db", url, *args)
            assert r.returncode != 0 and "Traceback" not in r.stderr, (sep, args, r.stderr[-500:])
            _assert_hidden(r.stdout + r.stderr, f"cli {' '.join(args)} {sep}")
    r = _lane("simulate", "--from-ledger", "--db", userinfo)
    assert r.returncode != 0 and "Traceback" not in r.stderr, (sep, r.stderr[-500:])
    _assert_hidden(r.stdout + r.stderr, f"simulate --db {sep}")


@pytest.mark.postgres
@pytest.mark.parametrize("sep", ["space", "tab", "hash", "at", "query"])
def test_reachable_ledger_never_prints_the_password(pg_url, sep):
    """Trust authentication accepts any password: every command succeeds and must still hide it."""
    pg_admin().close()
    if sep == "query":
        url = pg_url + f"&sslpassword={HEAD}x{TAIL}"
    else:
        url = pg_url.replace("root@", f"root:{HEAD}{SEPARATORS[sep]}{TAIL}@", 1)
    led = Ledger(url)
    led.set_lane("free", allowance=1000, ceiling=1000)
    [lease] = (led.submit("s", 10, "free"), led.tick("free"))[1]
    led.settle(lease, 12)
    _assert_hidden(repr(led) + str(led.url), f"api repr {sep}")
    led.close()
    for args in (
        ["db", "upgrade"],
        ["lanes", "--json"],
        ["simulate", "--from-ledger", "--days", "1", "--policies", "lane", "--json"],
    ):
        r = _lane("--db", url, *args)
        assert r.returncode == 0, (sep, args, r.returncode, r.stderr[-500:])
        _assert_hidden(r.stdout + r.stderr, f"cli {' '.join(args)} {sep}")
    shown = _lane("--db", url, "db", "upgrade").stdout
    assert "***" in shown and "root" in shown, shown  # the URL is shown, its password masked
    r = _lane("--db", url, "simulate", "--from-ledger", "--days", "1", "--lane", "nosuchlane")
    assert r.returncode != 0
    _assert_hidden(r.stdout + r.stderr, f"simulate error {sep}")


@pytest.mark.postgres
@pytest.mark.prefect
def test_flow_logs_never_print_the_password(prefect_server, pg_url, capfd, monkeypatch):
    """The scheduled flows log the ledger they use: with its password masked."""
    import logging

    from prefect.flows import load_flow_from_entrypoint

    pg_admin().close()
    url = pg_url.replace("root@", f"root:{HEAD} {TAIL}@", 1)  # a space: the old masking stopped there
    Ledger(url).close()
    root = Path(__file__).parents[2]
    records: list[logging.LogRecord] = []
    handler = logging.Handler(logging.DEBUG)
    handler.emit = records.append
    seen = logging.getLogger("lane-test-flow-logs")
    seen.addHandler(handler)
    seen.setLevel(logging.DEBUG)
    seen.propagate = False
    try:
        for entry in ("flows/lane_status.py:lane_status", "flows/park_overdue.py:park_overdue"):
            flow = load_flow_from_entrypoint(str(root / entry))
            # what the flow hands its run logger, whatever level the suite runs Prefect at
            monkeypatch.setitem(flow.fn.__globals__, "get_run_logger", lambda: seen)
            flow(db=url)
    finally:
        seen.removeHandler(handler)
    out, err = capfd.readouterr()
    logged = "\n".join([out, err, *(r.getMessage() for r in records)])
    assert "ledger: postgresql+psycopg://root:***@" in logged, logged[-1500:]  # the line is there, masked
    _assert_hidden(logged, "flow logs")


def _role(password: str):
    """A real role with ``password`` and a schema it owns (trust auth lets it log in)."""
    name = "lane_pw_" + uuid.uuid4().hex[:10]
    admin = pg_admin()
    admin.execute(f"create role {name} login password '{password.replace(chr(39), chr(39) * 2)}'")
    admin.execute(f"create schema {name} authorization {name}")
    admin.close()
    return name


def _drop_role(name: str) -> None:
    admin = pg_admin()
    admin.execute(f"drop schema if exists {name} cascade")
    admin.execute(f"drop role if exists {name}")
    admin.close()


@pytest.mark.postgres
def test_one_parser_for_connecting_and_migrating_pg():
    password = "p@ss/w#rd"
    name = _role(password)
    try:
        encoded = quote(password, safe="")
        forms = {
            "encoded": encoded,
            "raw @": password.replace("/", "%2F").replace("#", "%23"),
            "raw @ and #": password.replace("/", "%2F"),
        }
        took = {}
        for label, pw in forms.items():
            url = _pg_base_url(f"{name}:{pw}", query=f"?options=-csearch_path%3D{name}&connect_timeout=3")
            admin = pg_admin()
            admin.execute(f"drop schema if exists {name} cascade; create schema {name} authorization {name}")
            admin.close()
            t0 = time.monotonic()
            led = Ledger(url, retry_for=5.0)
            try:
                assert led.upgrade() is not None
                led.set_lane("free", allowance=100, ceiling=100)
                assert "free" in [row["lane"] for row in led.lanes()]
            finally:
                led.close()
            took[label] = time.monotonic() - t0
            admin = pg_admin()
            owner = admin.execute(
                f"select tableowner from pg_tables where schemaname = '{name}' and tablename = 'alembic_version'"
            ).fetchone()
            admin.close()
            assert owner == (name,), (label, owner)  # migrated by that very role, in its schema
            r = _lane("--db", url, "db", "upgrade")
            assert r.returncode == 0 and "schema at revision" in r.stdout, (label, r.stderr[-400:])
            for piece in ("p@ss", "w#rd", encoded):
                assert piece not in r.stdout + r.stderr, (label, r.stdout)
        LEAKS["pg"] = took
    finally:
        _drop_role(name)


@pytest.mark.parametrize(
    "name, on_disk",
    [("a%20b.db", "a b.db"), ("a b.db", "a b.db"), ("odd%zz.db", "odd%zz.db"), ("c%2525.db", "c%25.db")],
)
def test_one_parser_for_connecting_and_migrating_sqlite(tmp_path, name, on_disk):
    url = f"sqlite:///{tmp_path / name}"
    led = Ledger(url)
    try:
        led.set_lane("free", allowance=100, ceiling=100)
        led.submit("s", 5, "free")
        assert led.upgrade() is not None
    finally:
        led.close()
    files = sorted(p.name for p in tmp_path.iterdir() if not p.name.endswith(("-wal", "-shm", "-journal")))
    assert files == [on_disk], f"{url}: files {files}, expected one ledger {on_disk!r}"
    conn = sqlite3.connect(tmp_path / on_disk)
    try:
        assert conn.execute("select count(*) from job").fetchone() == (1,)
        assert conn.execute("select version_num from alembic_version").fetchone()[0]
    finally:
        conn.close()
    r = _lane("--db", url, "lanes", "--json")
    assert r.returncode == 0 and '"free"' in r.stdout, r.stderr[-300:]
    LEAKS.setdefault("sqlite", []).append(name)


@pytest.mark.parametrize("bad", ["u:p/w@h/db", "u:p?w@h/db", "u:p/w@h:5432/db"])
def test_reserved_character_in_password_is_a_clear_refusal(bad):
    url = "postgresql+psycopg://" + bad.replace("p/w", HEAD + "/" + TAIL).replace("p?w", HEAD + "?" + TAIL)
    with pytest.raises(LaneError) as info:
        Ledger(url, retry_for=0.5).lanes()
    msg = str(info.value)
    _assert_hidden(msg, "api parse")
    assert "percent-encode" in msg and "\n" not in msg, msg


def _figure() -> str | None:
    if not LEAKS["checked"]:
        return None
    seps = sorted(LEAKS["seps"] & set(SEPARATORS))
    out = (
        f"secrets: {LEAKS['checked']} outputs checked ({', '.join(sorted(LEAKS['surfaces']))}; passwords with "
        f"{', '.join(seps) or 'none'} in the user info"
        + (", ?password=, ?sslpassword=" if seps else "")
        + "): no half of a password printed"
    )
    if "pg" in LEAKS:
        out += (
            "; a real role with password 'p@ss/w#rd' migrates and connects with one parser ("
            + ", ".join(f"{k} {v:.1f} s" for k, v in LEAKS["pg"].items())
            + "; before the fix: host 'ss...@127.0.0.1', retried)"
        )
    if LEAKS.get("sqlite"):
        out += f"; SQLite {', '.join(LEAKS['sqlite'])}: one file, migrated and opened alike"
    return out


late_figure(_figure)
