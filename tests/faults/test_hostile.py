"""Item 11: hostile input. Random names, numbers, ids and URLs through the Python API and the
CLI: every call succeeds or fails with a LaneError (CLI: non-zero exit, one line, no traceback),
and a failed call changes nothing. Passwords in database URLs are never printed."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import zlib
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from lane_plugin import LaneError, Ledger
from lane_plugin.cli import app
from lane_plugin.ledger.lanes import POLICY_FIELDS

from ..cli.stderr import error_lines
from .conftest import FULL, counts, late_figure, make_lane

EXAMPLES = 600 if FULL else 60
SECRET = "s3cr3t-Pa55"
CALLS = {"api": 0, "api_failed": 0, "cli": 0, "cli_failed": 0, "urls": 0}

sql = st.sampled_from(["'; drop table job; --", '" or 1=1 --', "free'--", "%s", "%(x)s", ":l", "?", "\\", "$$"])
texts = st.one_of(
    st.text(max_size=40),
    sql,
    st.just("x" * 10_000),
    st.just(""),
    st.just("   "),
    st.just("a\x00b"),
    st.just("\ud800"),
    st.just("free"),
    st.just("ünï©ødé ✓ 😀"),
    st.just("line\nbreak"),
)
numbers = st.one_of(
    st.integers(-(10**15), 10**15),
    st.integers(-5, 5),
    st.just(10**30),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0.5, 1.0, -0.0, 3.0]),
    st.text(max_size=5),
    st.none(),
    st.booleans(),
)
values = st.one_of(texts, numbers)


_SEEDED: dict = {}  # the seeded ledger every example starts from: built once, copied (migrating each cost 0.5 s)


def _fresh(tmp: Path) -> tuple[Ledger, list[str]]:
    """A ledger of its own in ``tmp``: lane ``free``, three seed jobs leased (an hour's lease: live through the
    module), one parked."""
    if not _SEEDED:
        seed_dir = Path(tempfile.mkdtemp(prefix="lane-hostile-seed-"))
        led = Ledger(f"sqlite:///{seed_dir / 'ledger.db'}")
        make_lane(led, "free", ceiling=1000, lease_seconds=3600.0)
        _SEEDED["jobs"] = [led.submit("seed", 10, "free", key=f"seed-{i}") for i in range(3)]
        assert len(led.tick("free")) == 3
        led.park(led.submit("parked", 5, "free"), "operator")
        led.close()
        _SEEDED["files"] = sorted(seed_dir.glob("ledger.db*"))  # the database, and its WAL if one is left
    for f in _SEEDED["files"]:
        shutil.copy(f, tmp / f.name)
    return Ledger(f"sqlite:///{tmp / 'ledger.db'}"), list(_SEEDED["jobs"])


@pytest.fixture(scope="module")
def ledger_dir():
    d = Path(tempfile.mkdtemp(prefix="lane-hostile-"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _api_call(led: Ledger, jobs: list[str], op: str, a, b, c):
    job = a if not isinstance(a, int) or isinstance(a, bool) else jobs[a % len(jobs)]
    if op == "submit":
        return led.submit(a, b, c if isinstance(c, str) else "free")
    if op == "submit_kw":
        return led.submit("s", 5, "free", key=a, deadline=b, wait_seconds=c)
    if op == "settle":
        return led.settle(job, b, attempt=c)
    if op == "renew":
        return led.renew(job, b)
    if op == "tick":
        return led.tick(a)
    if op == "park":
        return led.park(job, b)
    if op in ("requeue", "drop", "job", "acquire"):
        return getattr(led, op)(job)
    if op == "set_lane":
        # crc32, not hash(): a failing example must pick the same field again under another PYTHONHASHSEED
        field = POLICY_FIELDS[zlib.crc32(repr(b).encode()) % len(POLICY_FIELDS)] if not isinstance(b, str) else b
        return led.set_lane(a if isinstance(a, str) else "free", **{field if field.isidentifier() else "x": c})
    if op == "read":  # every read that takes a lane name
        reads = [
            lambda: led.lane(a),
            lambda: led.tail(a),
            lambda: led.settled_jobs(lane=a),
            lambda: led.spend(lane=a),
            lambda: led.shadow_estimates(lane=a),
            lambda: led.estimator_samples("v1", lane=a),
            lambda: led.report_lane_states(a),
        ]
        return reads[zlib.crc32(repr(b).encode()) % len(reads)]()
    raise AssertionError(op)


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    op=st.sampled_from(
        [
            "submit",
            "submit_kw",
            "settle",
            "renew",
            "tick",
            "park",
            "requeue",
            "drop",
            "job",
            "acquire",
            "set_lane",
            "read",
        ]
    ),
    a=st.one_of(values, st.integers(0, 2)),
    b=values,
    c=values,
)
def test_api_hostile_input(ledger_dir, op, a, b, c):
    tmp = Path(tempfile.mkdtemp(dir=ledger_dir))
    led, jobs = _fresh(tmp)
    before, audit_before = counts(led), led.audit()
    CALLS["api"] += 1
    try:
        _api_call(led, jobs, op, a, b, c)
    except LaneError as exc:
        CALLS["api_failed"] += 1
        msg = str(exc)
        assert msg.strip() and len(msg) < 2000, f"unclear message {msg!r}"
        assert counts(led) == before, f"failed {op} changed the ledger"
    after = led.audit()
    if op == "set_lane" and after:  # a successful set_lane may lower the ceiling below what is admitted
        assert all("or the ceiling was lowered" in line for line in after), after
        assert led.lane("free").ceiling < 30
    else:
        assert after == audit_before == []
    led.close()
    shutil.rmtree(tmp, ignore_errors=True)


def _cli_args(cmd: str, a, b) -> list[str]:
    s = lambda v: v if isinstance(v, str) else repr(v)  # noqa: E731  CLI arguments are strings
    return {
        "submit": ["submit", "--stage", s(a), "--est", s(b)],
        "submit_lane": ["submit", "--stage", "x", "--est", "5", "--lane", s(a), "--wait", s(b)],
        "settle": ["settle", s(a), "--actual", s(b)],
        "settle_attempt": ["settle", s(a), "--actual", "1", "--attempt", s(b), "--json"],
        "tick": ["tick", "--lane", s(a), "--json"],
        "set": ["lanes", "set", s(a), "--ceiling", s(b)],
        "set_float": ["lanes", "set", "free", "--start-fraction", s(a), "--lease-seconds", s(b)],
        "requeue": ["tail", "requeue", s(a)],
        "drop": ["tail", "drop", s(a)],
        "audit": ["audit", "--grace", s(a)],
    }[cmd]


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    cmd=st.sampled_from(
        ["submit", "submit_lane", "settle", "settle_attempt", "tick", "set", "set_float", "requeue", "drop", "audit"]
    ),
    a=values,
    b=values,
)
def test_cli_hostile_input(ledger_dir, cmd, a, b):
    tmp = Path(tempfile.mkdtemp(dir=ledger_dir))
    led, jobs = _fresh(tmp)
    before = counts(led)
    args = [x.replace("\x00", "") for x in _cli_args(cmd, a, b)]  # argv cannot carry NUL
    args = [x.encode("utf-8", "replace").decode() for x in args]
    CALLS["cli"] += 1
    result = CliRunner().invoke(app, ["--db", str(led.url), *args])
    exc = result.exception
    if result.exit_code != 0:
        CALLS["cli_failed"] += 1
        assert isinstance(exc, (SystemExit, LaneError)), f"{cmd} {args!r} raised {type(exc).__name__}: {exc}"
        if isinstance(exc, LaneError):
            assert "\n" not in str(exc).strip() and str(exc).strip()
        if not (cmd == "audit"):
            assert counts(led) == before, f"failed {cmd} changed the ledger"
    assert "Traceback" not in result.output
    after = led.audit()
    if cmd == "set" and result.exit_code == 0 and after:  # the ceiling lowered below what is admitted
        assert all("or the ceiling was lowered" in line for line in after), after
    else:
        assert after == []
    led.close()
    shutil.rmtree(tmp, ignore_errors=True)


urls = st.one_of(
    st.text(max_size=60),
    st.builds(
        lambda s, r: s + r,
        st.sampled_from(
            [
                "sqlite://",
                "sqlite:///",
                "sqlite:////",
                "postgresql://",
                "postgresql+psycopg://",
                "postgres://",
                "mysql://",
                "postgresql+asyncpg://",
                "sqlite+pysqlite:///",
            ]
        ),
        st.one_of(
            st.text(max_size=40),
            sql,
            st.sampled_from(
                [
                    f"u:{SECRET}@127.0.0.1:1/x",
                    f"u:{SECRET}@127.0.0.1:99999/x",
                    f"u:{SECRET}@[::1/x",
                    f"u:{SECRET}@h:port/x",
                    f"u:{SECRET}@127.0.0.1:5432/",
                    f"root:{SECRET}@127.0.0.1:1/test?connect_timeout=2",
                    f"root:{SECRET}@127.0.0.1:1/test?nonsense=1",
                    f"u:pa@{SECRET}@127.0.0.1:1/x",
                    f"root@127.0.0.1:5432/test?password={SECRET}&port=1",
                    "nope/x.db",
                    "tmp/\x00.db",
                    "/",
                    ".",
                ]
            ),
        ),
    ),
)


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory):
    """Fuzzed SQLite paths land here, never in / or the checkout (relative ones too); so does the
    default ledger an empty URL opens (PREFECT_HOME), not the user's ~/.prefect/lane.db."""
    d = tmp_path_factory.mktemp("urls")
    old, saved = os.getcwd(), {k: os.environ.get(k) for k in ("PREFECT_HOME", "LANE_DATABASE_URL")}
    os.chdir(d)
    os.environ["PREFECT_HOME"] = str(d / "prefect-home")
    os.environ.pop("LANE_DATABASE_URL", None)
    yield d
    os.chdir(old)
    for k, v in saved.items():
        os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(url=urls)
def test_malformed_urls(sandbox, url):
    CALLS["urls"] += 1
    if url.lower().startswith(("sqlite:////", "sqlite+pysqlite:////")):
        url = url.replace(":////", f":///{sandbox}/", 1)  # an absolute path, but inside the sandbox
    try:
        led = Ledger(url, retry_for=0.5)
        led.lanes()
    except LaneError as exc:
        # after sqlite:/// all is a file path, the user's own (a missing directory is named to them): no password
        assert SECRET not in str(exc) or re.match(r"(?i)sqlite(\+pysqlite)?:///", url), f"password printed: {exc}"
        return
    finally:
        if "led" in locals():
            led.close()


KNOWN_BAD_URLS = [  # each once broke: a TypeError, a raw OSError/ValueError, or a printed password
    f"postgresql+psycopg://root:{SECRET}@127.0.0.1:1/test?connect_timeout=2",
    f"postgresql+psycopg://root@127.0.0.1:1/test?password={SECRET}",
    f"postgresql+psycopg://u:pa@{SECRET}@127.0.0.1:1/x",
    "sqlite:///tmp/\x00.db",
    "sqlite:////proc/self/nope/x.db",
    "sqlite:////proc/version",  # a file that exists but cannot hold a ledger
    "POSTGRESQL://\x80/0",  # a host name that is not valid IDNA: UnicodeError from the driver
    "SQLITE:///~0",  # ~user of no such user: RuntimeError from pathlib
]


@pytest.mark.parametrize("url", KNOWN_BAD_URLS)
def test_known_bad_urls(url):
    with pytest.raises(LaneError) as info:
        Ledger(url, retry_for=0.5).lanes()
    assert SECRET not in str(info.value) and "\n" not in str(info.value)


def _lane(*args, env=None):
    exe = Path(sys.executable).with_name("lane")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "lane_plugin.cli"]
    return subprocess.run(
        cmd + list(args), capture_output=True, text=True, timeout=120, env={**os.environ, **(env or {})}
    )


def test_real_cli_errors_are_one_line(tmp_path):
    db = f"sqlite:///{tmp_path / 'l.db'}"
    cases = [
        (["--db", db, "submit", "--stage", "x" * 10_000, "--est", "5"], 2),
        (["--db", db, "settle", "no-such-job", "--actual", "5"], 3),
        (["--db", db, "submit", "--stage", "'; drop table job; --", "--est", "-5"], 2),
        (["--db", db, "tick", "--lane", "no such lane"], 3),
        (["--db", f"postgresql+psycopg://u:{SECRET}@127.0.0.1:1/x", "lanes"], 8),
        (["--db", "mysql://u:{SECRET}@h/x", "lanes"], 2),
    ]
    for args, code in cases:
        r = _lane(*args)
        assert r.returncode == code, (args[:4], r.returncode, r.stderr[-500:])
        assert "Traceback" not in r.stderr and SECRET not in r.stderr + r.stdout
        lines = error_lines(r.stderr)  # after the line naming the ledger, when one was resolved
        assert len(lines) == 1 and lines[0].startswith("lane: error: "), r.stderr[-500:]
    r = _lane("--db", db, "submit", "--stage", "x", "--est", "NaN")
    assert r.returncode == 2 and "Traceback" not in r.stderr and "Invalid value" in r.stderr  # typer usage error


@pytest.mark.postgres
def test_password_never_printed_pg(pg_url):
    from .conftest import pg_admin

    pg_admin().close()
    url = pg_url.replace("root@", f"root:{SECRET}@")  # trust auth: the password is accepted and ignored
    for args in (
        ["db", "upgrade"],
        ["lanes", "--json"],
        ["lanes", "set", "free", "--ceiling", "100", "--json"],
        ["tick", "--json"],
        ["audit"],
        ["tail", "--json"],
    ):
        r = _lane("--db", url, *args)
        assert r.returncode == 0, (args, r.stderr[-300:])
        assert SECRET not in r.stdout + r.stderr, f"`lane {' '.join(args)}` printed the password"
    r = _lane("--db", re.sub(r"@([^:/]+):\d+/", r"@\1:1/", url, count=1), "lanes", "--json")  # nothing listens on 1
    assert r.returncode == 8 and SECRET not in r.stdout + r.stderr


def _hostile_figure() -> str | None:
    if not CALLS["api"] and not CALLS["cli"]:
        return None
    return (
        f"hostile input: {CALLS['api']} API calls ({CALLS['api_failed']} refused with LaneError), "
        f"{CALLS['cli']} CLI calls ({CALLS['cli_failed']} refused, no traceback), {CALLS['urls']} malformed URLs; "
        "every refused call left row counts and audit unchanged; no password printed"
    )


late_figure(_hostile_figure)
