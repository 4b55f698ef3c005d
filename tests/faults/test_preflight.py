"""Issue 10 item 9: a lane's preflight names a check registered in code, never code named by a row.

Before the fix a lane row's ``module:function`` ran in every process that ticked the lane: write
access to one table was code execution on every worker (``os:abort`` killed every ticker, a row
naming ``preflight_checks:touch`` wrote a file); ``sys:exit`` made ``lane tick`` exit 0 silently
and ``Ledger.tick`` raise ``SystemExit``; a 15 s check with a 1 s timeout took 15 s.
The rows below are written with our own SQL, as an attacker with table access would.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lane_plugin import InvalidInput, Ledger

from .conftest import late_figure

ROOT = Path(__file__).parents[2]
CHECKS = "tests.faults.preflight_checks"
SEEN: dict = {}


def _lane(*args, env: dict | None = None) -> subprocess.CompletedProcess:
    exe = Path(sys.executable).with_name("lane")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "lane_plugin.cli"]
    full = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.run(cmd + list(args), capture_output=True, text=True, timeout=120, env=full)


def _ledger(tmp_path: Path, preflight_timeout: float = 1.0) -> tuple[str, Ledger]:
    url = f"sqlite:///{tmp_path / 'lane.db'}"
    led = Ledger(url)
    led.set_lane("free", allowance=1000, ceiling=1000, preflight_timeout=preflight_timeout)
    led.submit("s", 10, "free")
    return url, led


def _write_row(url: str, spec: str) -> None:
    """The attacker's write: our own SQL on the lane table."""
    conn = sqlite3.connect(url.split("sqlite:///", 1)[1])
    conn.execute("update lane set preflight = ? where name = 'free'", (spec,))
    conn.commit()
    conn.close()


def _register(name: str, fn) -> None:
    """Register ``fn`` as ``name``; on a lane_plugin without registration (before the fix) the row's
    ``module:function`` text ran the very same function, so the test shows the old behaviour there."""
    import lane_plugin

    if hasattr(lane_plugin, "register_preflight"):
        lane_plugin.register_preflight(name, fn)


def _unregister(name: str) -> None:
    import lane_plugin

    if hasattr(lane_plugin, "unregister_preflight"):
        lane_plugin.unregister_preflight(name)


def _preflight_row(led: Ledger) -> tuple:
    _, rows = led.rows("select preflight_ok, preflight_error from lane where name = 'free'")
    return bool(rows[0][0]), rows[0][1]


@pytest.mark.parametrize("spec", ["os:abort", "sys:exit", f"{CHECKS}:touch"])
def test_a_row_naming_code_runs_nothing(tmp_path, spec):
    url, led = _ledger(tmp_path)
    _write_row(url, spec)
    marker = tmp_path / "marker"
    r = _lane("--db", url, "tick", "--lane", "free", env={"LANE_TEST_PREFLIGHT_MARKER": str(marker)})
    assert r.returncode == 0, (spec, r.returncode, r.stderr[-400:])  # before: -6 (SIGABRT) for os:abort
    assert not marker.exists(), f"{spec}: the row's function ran"
    assert "preflight failed" in r.stderr and f"no preflight check named {spec!r}" in r.stderr, r.stderr[-400:]
    assert "leased 0 jobs" in r.stderr
    if spec != "os:abort":  # in this process too: nothing raised, nothing admitted, the reason recorded
        assert led.tick("free") == []
        ok, why = _preflight_row(led)
        assert not ok and f"no preflight check named {spec!r}" in why, why
    assert led.audit() == []
    led.close()
    SEEN.setdefault("rows", []).append(spec)


def test_lanes_set_refuses_an_unregistered_name(tmp_path):
    url, led = _ledger(tmp_path)
    for spec in ("os:abort", f"{CHECKS}:touch", "nosuch-check"):
        r = _lane("--db", url, "lanes", "set", "free", "--preflight", spec)
        assert r.returncode == 2, (spec, r.returncode, r.stderr[-300:])
        assert "invalid preflight" in r.stderr and "no preflight check named" in r.stderr and spec in r.stderr
        with pytest.raises(InvalidInput, match="no preflight check named"):
            led.set_lane("free", preflight=spec)
    assert led.lane("free").preflight is None
    led.close()
    SEEN["refused"] = True


def test_the_timeout_holds(tmp_path):
    name = f"{CHECKS}:slow"  # the same text a row held before the fix: there it ran for 15 s
    _register(name, __import__(CHECKS, fromlist=["slow"]).slow)
    try:
        url, led = _ledger(tmp_path, preflight_timeout=1.0)
        led.set_lane("free", preflight=name)
        t0 = time.monotonic()
        leases = led.tick("free")
        took = time.monotonic() - t0
        ok, why = _preflight_row(led)
        assert leases == [] and not ok and "took longer than its timeout of 1 s" in why, (leases, why)
        assert took < 5.0, f"tick took {took:.1f} s with a 1 s preflight timeout"
        led.preflight = type(led.preflight)(ttl=0.0)  # no cache: the hung check is not started twice
        assert led.tick("free") == [] and "still running" in _preflight_row(led)[1]
        led.close()
        SEEN["timeout"] = took
    finally:
        _unregister(name)


@pytest.mark.parametrize(
    "fn, shown", [("exits", "SystemExit: 3"), ("interrupt", "KeyboardInterrupt"), ("down", "returned False")]
)
def test_any_exception_is_a_failed_preflight(tmp_path, fn, shown):
    name = f"{CHECKS}:{fn}"
    _register(name, getattr(__import__(CHECKS, fromlist=[fn]), fn))
    try:
        url, led = _ledger(tmp_path)
        led.set_lane("free", preflight=name)
        assert led.tick("free") == []  # before: SystemExit / KeyboardInterrupt out of Ledger.tick
        ok, why = _preflight_row(led)
        assert not ok and shown in why, why
        assert {r["lane"]: r["preflight_ok"] for r in led.lanes()}["free"] is False
        led.close()
        SEEN.setdefault("raised", []).append(shown.split(":")[0])
    finally:
        _unregister(name)


def test_registered_in_code_and_by_entry_point(tmp_path):
    from lane_plugin import register_preflight, unregister_preflight

    url, led = _ledger(tmp_path)
    register_preflight("in-code-up", lambda: True)
    try:
        led.set_lane("free", preflight="in-code-up")
        assert len(led.tick("free")) == 1
    finally:
        unregister_preflight("in-code-up")
    dist = tmp_path / "site" / "lane_checks_demo-0.1.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: lane-checks-demo\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(f"[lane_plugin.preflights]\nprovider-up = {CHECKS}:up\n")
    site = {"PYTHONPATH": f"{tmp_path / 'site'}{os.pathsep}{ROOT}"}
    assert _lane("--db", url, "lanes", "set", "free", "--preflight", "provider-up").returncode == 2  # not installed
    r = _lane("--db", url, "lanes", "set", "free", "--preflight", "provider-up", env=site)
    assert r.returncode == 0, r.stderr[-300:]
    led.submit("s", 10, "free")
    r = _lane("--db", url, "tick", "--lane", "free", env=site)
    assert r.returncode == 0 and "leased 1 jobs" in r.stderr and "preflight failed" not in r.stderr, r.stderr
    r = _lane("--db", url, "tick", "--lane", "free")  # a process without the entry point: fails, says why
    assert r.returncode == 0 and "no preflight check named 'provider-up'" in r.stderr, r.stderr
    led.close()
    SEEN["entry_point"] = True


def _figure() -> str | None:
    if not SEEN:
        return None
    parts = []
    if SEEN.get("rows"):
        parts.append(
            f"rows naming {', '.join(SEEN['rows'])}: nothing ran, no process died, preflight failed "
            "with the reason (before: SIGABRT, a silent exit 0, the file written)"
        )
    if "timeout" in SEEN:
        parts.append(f"a 15 s check with timeout 1 s: tick returned in {SEEN['timeout']:.1f} s (before: 15 s)")
    if SEEN.get("raised"):
        parts.append(f"{', '.join(SEEN['raised'])} in a check: preflight failed, nothing raised from tick")
    if SEEN.get("refused"):
        parts.append("lanes set refuses unregistered names (exit 2)")
    return "preflight: " + "; ".join(parts)


late_figure(_figure)
