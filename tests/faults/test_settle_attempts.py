"""Issue 10 item 2: settling by a bare job id billed the wrong attempt and dropped tokens.

Lease, expire, reap, re-lease as attempt 2; the zombie (attempt 1) settles 500 and the live
worker (attempt 2) settles 120, both by the bare id as README showed: both landed on attempt 2,
the second passed as "replay: billed nothing" (exit 0), attempt 1 was never billed and 120
tokens vanished. Now a replay with another actual is a conflict (exit 6), a bare id that cannot
tell which attempt it is is refused (exit 2) and the attempt is named (``ID:ATTEMPT``, printed
by ``lane tick`` and ``lane submit``); a zombie settling between the reap and the re-lease is
billed late to its own attempt.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lane_plugin import LaneError, Ledger

from .conftest import assert_audit_clean, figure, make_lane


def _lane(*args):
    exe = Path(sys.executable).with_name("lane")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "lane_plugin.cli"]
    return subprocess.run(cmd + list(args), capture_output=True, text=True, timeout=120, env={**os.environ})


def _billed(led, job) -> dict[int, tuple[int, bool]]:
    cols, rows = led.rows("select attempt, actual, late from settlement where job_id = :j order by attempt", {"j": job})
    return {r[0]: (r[1], bool(r[2])) for r in rows}


def _settle_as_told(led, job, actual, attempt) -> str:
    """What a worker that knows its attempt (from its lease) does with README's bare id: settle it,
    and if the ledger cannot tell the attempt, say it."""
    try:
        r = led.settle(job, actual)
        return "replay" if r.replay else f"billed attempt {r.attempt}"
    except LaneError as exc:
        r = led.settle(f"{job}:{attempt}", actual)
        return f"refused ({type(exc).__name__}), then billed attempt {r.attempt}"


@pytest.mark.parametrize("db", ["sqlite", "postgresql"])
def test_a_zombie_and_the_retry_settling_by_bare_id_lose_nothing(db, request, clock):
    url = request.getfixturevalue("sqlite_url" if db == "sqlite" else "pg_url")
    led = Ledger(url, clock=clock)
    make_lane(led, ceiling=1000, lease_seconds=10.0, max_attempts=3)
    job = led.submit("s", 100)
    [first] = led.tick()
    clock.t += 11
    assert led.reap().requeued == [job]
    [second] = led.tick()
    assert (first.attempt, second.attempt) == (1, 2)
    zombie = _settle_as_told(led, job, 500, first.attempt)
    live = _settle_as_told(led, job, 120, second.attempt)
    billed = _billed(led, job)
    spent = led.lane("free").spent
    figure(
        f"settle by bare id {db}: zombie 500 then live worker 120 after a re-lease: zombie {zombie}, live {live}; "
        f"billed {spent} of 620 ({billed})"
    )
    assert billed == {1: (500, True), 2: (120, False)}
    assert spent == 620 and led.job(job)["actual"] == 620
    with pytest.raises(LaneError, match="already settled with 120"):  # ConflictingReplay: exit 6 in the CLI
        led.settle(job, 121, attempt=2)
    assert led.settle(f"{job}:2", 120).replay
    assert led.lane("free").spent == 620
    assert_audit_clean(led)


@pytest.mark.parametrize("db", ["sqlite", "postgresql"])
def test_a_zombie_settling_between_the_reap_and_the_re_lease_is_billed_late(db, request, clock):
    url = request.getfixturevalue("sqlite_url" if db == "sqlite" else "pg_url")
    led = Ledger(url, clock=clock)
    make_lane(led, ceiling=1000, lease_seconds=10.0, max_attempts=3)
    job = led.submit("s", 100)
    led.tick()
    clock.t += 11
    led.reap()
    r = led.settle(job, 70)  # the zombie, by bare id, before anyone leased attempt 2
    assert (r.attempt, r.late, r.replay, r.actual) == (1, True, False, 70)
    [again] = led.tick()
    assert again.attempt == 2
    assert led.settle(again, 90).late is False
    assert _billed(led, job) == {1: (70, True), 2: (90, False)} and led.lane("free").spent == 160
    assert_audit_clean(led)


def test_the_shell_loop_names_the_attempt(tmp_path):
    db = f"sqlite:///{tmp_path / 'l.db'}"
    assert _lane("--db", db, "lanes", "set", "free", "--lease-seconds", "1").returncode == 0
    sub = _lane("--db", db, "submit", "--stage", "s", "--est", "100")
    job = sub.stdout.strip()
    assert len(job) == 32 and f"{job}:1" in sub.stderr  # stdout stays the id alone: id=$(lane submit ...)
    assert (
        json.loads(_lane("--db", db, "submit", "--stage", "s", "--est", "100", "--key", "k", "--json").stdout)[
            "attempt"
        ]
        == 1
    )
    leased = {x["id"]: x for x in json.loads(_lane("--db", db, "tick", "--json").stdout)}
    assert (leased[job]["attempt"], leased[job]["ref"]) == (1, f"{job}:1")
    time.sleep(1.2)
    assert _lane("--db", db, "reap").returncode == 0
    [relet] = [x for x in json.loads(_lane("--db", db, "tick", "--json").stdout) if x["id"] == job]
    assert relet["ref"] == f"{job}:2"
    codes = {}
    codes["bare"] = _lane("--db", db, "settle", job, "--actual", "500")
    codes["zombie"] = _lane("--db", db, "settle", f"{job}:1", "--actual", "500")
    codes["live"] = _lane("--db", db, "settle", job, "--attempt", "2", "--actual", "120")
    codes["conflict"] = _lane("--db", db, "settle", f"{job}:2", "--actual", "121")
    codes["replay"] = _lane("--db", db, "settle", f"{job}:2", "--actual", "120")
    codes["disagree"] = _lane("--db", db, "settle", f"{job}:2", "--attempt", "1", "--actual", "120")
    got = {k: p.returncode for k, p in codes.items()}
    spent = next(x for x in json.loads(_lane("--db", db, "lanes", "--json").stdout) if x["lane"] == "free")["spent"]
    figure(f"settle attempts cli: exit codes {got}; spent {spent} of 500 + 120")
    assert got == {"bare": 2, "zombie": 0, "live": 0, "conflict": 6, "replay": 0, "disagree": 2}
    assert "attempts 1 to 2" in codes["bare"].stderr and f"{job}:ATTEMPT" in codes["bare"].stderr
    assert "late" in codes["zombie"].stdout and "replay: billed nothing" in codes["replay"].stdout
    assert "already settled with 120" in codes["conflict"].stderr
    assert spent == 620
    assert _lane("--db", db, "audit").returncode == 0
