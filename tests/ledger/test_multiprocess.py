"""Several OS processes ticking and settling one lane at once: I1-I4 hold on both databases."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lane_plugin import Ledger

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("procs", [4])
def test_concurrent_workers_keep_the_invariants(ledger_url, procs):
    led = Ledger(ledger_url)
    led.set_lane(
        "mp", allowance=3_000, ceiling=3_000, start_fraction=1.0, burst_tokens=2_000, max_leased=8, window_seconds=0.05
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    workers = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.ledger.worker", ledger_url, "mp", "60", str(seed)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            cwd=ROOT,
        )
        for seed in range(procs)
    ]
    results = []
    for w in workers:
        out, err = w.communicate(timeout=120)
        assert w.returncode == 0, err
        results.append(json.loads(out.strip().splitlines()[-1]))
    assert all(r["errors"] == [] for r in results)
    total = procs * 60
    assert sum(r["submitted"] for r in results) == total
    lane = led.lane("mp")
    cols, rows = led.rows("select count(*), coalesce(sum(actual), 0) from settlement where lane = 'mp'")
    settled, billed = rows[0]
    assert settled == sum(r["settled"] for r in results)
    assert lane.spent == billed  # I3
    assert lane.reserved == 0 and lane.leased == 0  # I2 once everything settled
    assert lane.spent - lane.overage > 2_500, "the ceiling was meant to bind"
    assert lane.spent - lane.overage <= lane.ceiling  # I1
    assert led.audit() == []  # I1-I4 from the tables


@pytest.mark.postgres
def test_lane_pg_pool_caps_a_process_s_connections(monkeypatch):
    """``LANE_PG_POOL`` is the most connections one process's threads hold at once (the watcher's listener
    apart); a bad value is refused naming the variable, before anything is written."""
    import threading

    from lane_plugin.errors import InvalidInput

    from ..conftest import PgSchema, postgres_or_skip

    schema = PgSchema(postgres_or_skip())
    try:
        monkeypatch.setenv("LANE_PG_POOL", "0")
        with pytest.raises(InvalidInput, match="LANE_PG_POOL"):
            Ledger(schema.url)
        monkeypatch.setenv("LANE_PG_POOL", "2")
        led = Ledger(schema.url)
        led.set_lane("free", ceiling=10**9, allowance=10**9, start_fraction=1.0, burst_tokens=10**9)
        led.submit("s", 1, "free", key="warm-up")
        before = set(led.db.backend_pids)  # the schema's first check, and the pool's first connection
        backends: set[int] = set()
        errors: list[BaseException] = []

        def work():
            try:
                for i in range(15):
                    led.submit("s", 1, "free", key=f"{threading.get_ident()}-{i}")
                backends.update(led.db.backend_pids)
            except BaseException as exc:  # reported below
                errors.append(exc)

        threads = [threading.Thread(target=work) for _ in range(12)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        assert led.db.pool_size == 2
        opened = backends - before
        assert len(opened) <= 1, f"{len(opened)} more connections for 12 threads with LANE_PG_POOL=2 (1 was open)"
        led.close()
    finally:
        schema.drop()
